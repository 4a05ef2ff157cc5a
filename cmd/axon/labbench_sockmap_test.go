package main

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in        string
		want      []int
		wantError string
	}{
		{in: "1,4,16,64,256,1K,4K,16K", want: []int{1, 4, 16, 64, 256, 1024, 4096, 16384}},
		{in: " 64 , 16K", want: []int{64, 16384}},
		{in: "0", wantError: `"0" is not a message size`},
		{in: "64,,1K", wantError: `"" is not a message size`},
		{in: "1M", wantError: `"1M" is not a message size`},
		{in: "-4", wantError: `"-4" is not a message size`},
	}
	for _, tc := range tests {
		got, err := parseSizes(tc.in)
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("parseSizes(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantError)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseSizes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
