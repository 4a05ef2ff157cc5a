package inetcsum

import "testing"

func TestChecksum(t *testing.T) {
	// an IPv4 header with its checksum field (bytes 10-11) zeroed
	ipv4 := []byte{
		0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
		0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
	}
	ipv4Sum := append([]byte(nil), ipv4...)
	ipv4Sum[10], ipv4Sum[11] = 0xb8, 0x61
	for _, tc := range []struct {
		name    string
		b       []byte
		initial uint32
		want    uint16
	}{
		{"empty", nil, 0, 0xffff},
		{"RFC 1071 example", []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0, ^uint16(0xddf2)},
		{"odd length pads with a zero byte", []byte{0xff}, 0, ^uint16(0xff00)},
		{"odd length, three bytes", []byte{0x12, 0x34, 0x56}, 0, ^uint16(0x1234 + 0x5600)},
		{"initial sum is added", []byte{0x00, 0x01}, 0x0002, ^uint16(0x0003)},
		{"carry folds back", []byte{0xff, 0xff, 0x00, 0x01}, 0, ^uint16(0x0001)},
		{"initial sum above 16 bits folds", nil, 0x1fffe, ^uint16(0xffff)},
		{"IPv4 header", ipv4, 0, 0xb861},
		{"IPv4 header with its checksum sums to 0", ipv4Sum, 0, 0},
		{"all ones", []byte{0xff, 0xff, 0xff, 0xff}, 0, 0},
		// 0x20000 words of 0xffff overflow a 32-bit accumulator
		{"large buffer", ones(0x40000), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Checksum(tc.b, tc.initial); got != tc.want {
				t.Errorf("Checksum(%d bytes, %#x) = %#04x, want %#04x", len(tc.b), tc.initial, got, tc.want)
			}
		})
	}
}

func ones(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0xff
	}
	return b
}
