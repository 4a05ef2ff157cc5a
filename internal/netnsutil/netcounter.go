package netnsutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ReadNetCounter returns the value of a counter of /proc/net/<file> ("snmp"
// or "netstat": header and value lines per group; e.g. "netstat", "TcpExt",
// "TCPDSACKRecvSegs") as seen inside the network namespace at nsPath ("" for
// the caller's own).
func ReadNetCounter(nsPath, file, group, field string) (uint64, error) {
	var b []byte
	read := func() (err error) {
		// /proc/net follows the thread group leader; thread-self follows us.
		b, err = os.ReadFile("/proc/thread-self/net/" + file)
		return err
	}
	var err error
	if nsPath == "" {
		err = read()
	} else {
		err = DoAt(nsPath, read)
	}
	if err != nil {
		return 0, fmt.Errorf("read /proc/net/%s in %s: %w", file, nsPath, err)
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		hdr := strings.Fields(lines[i])
		val := strings.Fields(lines[i+1])
		if len(hdr) == 0 || hdr[0] != group+":" || len(val) != len(hdr) || val[0] != hdr[0] {
			continue
		}
		for j, h := range hdr {
			if h == field {
				return strconv.ParseUint(val[j], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("counter %s %s not found in /proc/net/%s of %s", group, field, file, nsPath)
}
