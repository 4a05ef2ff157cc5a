// Package inetcsum computes the Internet checksum (RFC 1071) that IPv4
// headers, ICMP, UDP and TCP carry.
package inetcsum

import "encoding/binary"

// Checksum is the Internet checksum of b: the one's complement of the one's
// complement sum of its 16-bit big-endian words, an odd last byte padded with
// a zero byte. initial is a partial sum to start from (0, or the sum of a
// pseudo-header for UDP, TCP and ICMPv6). A buffer that already carries its
// correct checksum sums to 0.
func Checksum(b []byte, initial uint32) uint16 {
	s := uint64(initial)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint64(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
