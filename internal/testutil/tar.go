package testutil

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
)

// TarMember is one member of a tar stream: its header and its content
// (empty for directories and links).
type TarMember struct {
	Header *tar.Header
	Data   []byte
}

// TarMembers reads every member of the tar stream r, in archive order, for
// tests of what an archive holds (the agent image's layer, an `axon sysdump`
// archive). A gzip-compressed stream (.tar.gz) is recognised by its magic
// bytes and decompressed. Any read error fails the test.
func TarMembers(t testing.TB, r io.Reader) []TarMember {
	t.Helper()
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			t.Fatalf("tar: gzip header: %v", err)
		}
		defer gz.Close()
		r = gz
	} else {
		r = br
	}
	var members []TarMember
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return members
		}
		if err != nil {
			t.Fatalf("tar: member %d: %v", len(members)+1, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("tar: content of %s: %v", h.Name, err)
		}
		members = append(members, TarMember{Header: h, Data: data})
	}
}
