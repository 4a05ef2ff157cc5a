package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// IperfResult is what the runner keeps from one `iperf3 -c ... -J` run.
type IperfResult struct {
	BitsPerSecond float64 // end.sum_received.bits_per_second (what the receiver got)
	SentBPS       float64 // end.sum_sent.bits_per_second
	Retransmits   int     // end.sum_sent.retransmits
	Seconds       float64 // end.sum_received.seconds
	Bytes         float64 // end.sum_received.bytes
	Congestion    string  // end.sender_tcp_congestion
}

// ParseIperfJSON parses the JSON document that `iperf3 -c ... -J` prints. iperf3
// reports failures inside the JSON ("error") and may still exit 0, so an error
// field is returned as a Go error.
func ParseIperfJSON(data []byte) (IperfResult, error) {
	var doc struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Retransmits   int     `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Seconds       float64 `json:"seconds"`
				Bytes         float64 `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SenderCongestion string `json:"sender_tcp_congestion"`
		} `json:"end"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return IperfResult{}, fmt.Errorf("parse iperf3 JSON: %w", err)
	}
	if doc.Error != "" {
		return IperfResult{}, fmt.Errorf("iperf3: %s", doc.Error)
	}
	r := IperfResult{
		BitsPerSecond: doc.End.SumReceived.BitsPerSecond,
		SentBPS:       doc.End.SumSent.BitsPerSecond,
		Retransmits:   doc.End.SumSent.Retransmits,
		Seconds:       doc.End.SumReceived.Seconds,
		Bytes:         doc.End.SumReceived.Bytes,
		Congestion:    doc.End.SenderCongestion,
	}
	if r.BitsPerSecond <= 0 {
		return r, errors.New("iperf3 JSON has no end.sum_received.bits_per_second: the test did not complete")
	}
	return r, nil
}

// SockperfResult is what the runner keeps from one `sockperf ping-pong` run.
// When RTT is true the values are round-trip times (--full-rtt); otherwise
// sockperf printed one-way latency (RTT/2).
type SockperfResult struct {
	RTT          bool
	Avg          float64             // µs
	Min, Max     float64             // µs
	Percentiles  map[float64]float64 // percentile (e.g. 50, 99, 99.9) → µs
	Observations int
}

// P returns the given percentile, or an error if sockperf did not print it.
func (s SockperfResult) P(pct float64) (float64, error) {
	v, ok := s.Percentiles[pct]
	if !ok {
		return 0, fmt.Errorf("sockperf output has no percentile %g", pct)
	}
	return v, nil
}

var (
	ansiRE       = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	pctRE        = regexp.MustCompile(`percentile\s+([0-9.]+)\s*=\s*([0-9.]+)`)
	minMaxRE     = regexp.MustCompile(`<(MIN|MAX)> observation\s*=\s*([0-9.]+)`)
	summaryRE    = regexp.MustCompile(`Summary: (Round trip|Latency) is\s+([0-9.]+)\s*usec`)
	totalObsRE   = regexp.MustCompile(`Total\s+([0-9]+)\s+observations`)
	sockperfErrs = []string{"ERROR", "connection refused", "Connection refused"}
)

// ParseSockperf parses the text that `sockperf ping-pong` prints (its colour
// escapes included).
func ParseSockperf(out []byte) (SockperfResult, error) {
	res := SockperfResult{Percentiles: map[float64]float64{}}
	var summary bool
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := ansiRE.ReplaceAllString(sc.Text(), "")
		if m := summaryRE.FindStringSubmatch(line); m != nil {
			summary = true
			res.RTT = m[1] == "Round trip"
			res.Avg, _ = strconv.ParseFloat(m[2], 64)
			continue
		}
		if m := pctRE.FindStringSubmatch(line); m != nil {
			p, err1 := strconv.ParseFloat(m[1], 64)
			v, err2 := strconv.ParseFloat(m[2], 64)
			if err1 == nil && err2 == nil {
				res.Percentiles[p] = v
			}
			continue
		}
		if m := minMaxRE.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			if m[1] == "MIN" {
				res.Min = v
			} else {
				res.Max = v
			}
			continue
		}
		if m := totalObsRE.FindStringSubmatch(line); m != nil {
			res.Observations, _ = strconv.Atoi(m[1])
		}
	}
	if !summary || len(res.Percentiles) == 0 {
		msg := "no summary or percentile lines"
		for _, l := range strings.Split(ansiRE.ReplaceAllString(string(out), ""), "\n") {
			for _, e := range sockperfErrs {
				if strings.Contains(l, e) {
					msg = strings.TrimSpace(l)
				}
			}
		}
		return res, fmt.Errorf("parse sockperf output: %s", msg)
	}
	return res, nil
}

// ParsePressure parses /proc/pressure/cpu and returns the "some" line's avg10
// (percent) and total (µs stalled since boot).
func ParsePressure(data []byte) (avg10 float64, total uint64, err error) {
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		var haveAvg, haveTotal bool
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			switch k {
			case "avg10":
				avg10, err = strconv.ParseFloat(v, 64)
				haveAvg = err == nil
			case "total":
				total, err = strconv.ParseUint(v, 10, 64)
				haveTotal = err == nil
			}
		}
		if !haveAvg || !haveTotal {
			return 0, 0, fmt.Errorf("parse pressure line %q: want avg10= and total=", line)
		}
		return avg10, total, nil
	}
	return 0, 0, errors.New("parse pressure: no \"some\" line")
}

// QperfResult is one test of a `qperf -uu -v -vvs <server> tcp_bw|tcp_lat`
// run. -uu (unified units) prints plain numbers in bytes, bytes/sec and ns.
type QperfResult struct {
	Test        string  // "tcp_bw", "tcp_lat", ...
	BytesPerSec float64 // tcp_bw: bw, what the receiver got per second
	LatencyNs   float64 // tcp_lat: latency, one way (half the round trip)
	MsgSize     int     // msg_size, bytes
	MsgRate     float64 // msg_rate, messages per second
	Seconds     float64 // time
	RecvBytes   float64 // tcp_bw: recv_bytes; tcp_lat: loc_recv_bytes (0 when not printed)
}

// qperfUnits are the units `qperf -uu` prints, per field; a value in another
// unit means qperf ran without -uu (e.g. "1.27 GB/sec").
var qperfUnits = map[string]string{
	"bw": "bytes/sec", "recv_bw": "bytes/sec", "latency": "ns", "msg_size": "bytes", "msg_rate": "/sec", "time": "ns",
	"recv_bytes": "bytes", "loc_recv_bytes": "bytes",
}

// Measure is r as one benchmark sample of a secs-long run: the latency in
// ns (a _lat test) or the received bytes per second (a _bw test), and the
// operations behind it: round trips (run time / latency) or messages
// received (bytes / msgSize).
func (r QperfResult) Measure(secs, msgSize int) (value, ops float64) {
	if strings.HasSuffix(r.Test, "_lat") {
		if r.LatencyNs > 0 {
			ops = float64(secs) * 1e9 / r.LatencyNs
		}
		return r.LatencyNs, ops
	}
	return r.BytesPerSec, r.BytesPerSec * float64(secs) / float64(msgSize)
}

// ParseQperf parses what qperf prints for one or more tests: a line "test:"
// followed by indented "name = value unit" lines. A test without its result
// line (bw for *_bw tests, recv_bw for udp_bw, latency for *_lat tests), or qperf's own error
// ("failed to connect"), is an error.
func ParseQperf(out []byte) ([]QperfResult, error) {
	var res []QperfResult
	var cur *QperfResult
	var seen map[string]bool
	finish := func() error {
		if cur == nil {
			return nil
		}
		want := "bw"
		if strings.HasSuffix(cur.Test, "_lat") {
			want = "latency"
		}
		if want == "bw" && !seen["bw"] && seen["recv_bw"] {
			seen["bw"] = true // udp_bw: what arrived (recv_bw) is its throughput
		}
		if !seen[want] {
			return fmt.Errorf("parse qperf output: test %s printed no %s", cur.Test, want)
		}
		res = append(res, *cur)
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			continue
		case !strings.HasPrefix(line, " ") && strings.HasSuffix(trimmed, ":") && !strings.Contains(trimmed, " "):
			if err := finish(); err != nil {
				return nil, err
			}
			cur, seen = &QperfResult{Test: strings.TrimSuffix(trimmed, ":")}, map[string]bool{}
			continue
		}
		name, rest, ok := strings.Cut(trimmed, "=")
		if !ok || cur == nil {
			return nil, fmt.Errorf("parse qperf output: %s", trimmed) // qperf's own error, e.g. "host: failed to connect"
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("parse qperf output: %q has no value", trimmed)
		}
		unit, known := qperfUnits[name]
		if !known {
			continue // costs, CPU use, message counts: not used
		}
		if got := strings.Join(f[1:], " "); got != unit {
			return nil, fmt.Errorf("parse qperf output: %s is in %q, want %q: run qperf with -uu (unified units)", name, got, unit)
		}
		v, err := strconv.ParseFloat(strings.ReplaceAll(f[0], ",", ""), 64)
		if err != nil {
			return nil, fmt.Errorf("parse qperf output: %s = %q: %w", name, f[0], err)
		}
		seen[name] = true
		switch name {
		case "bw", "recv_bw": // udp_bw prints send_bw and recv_bw: what arrived counts
			cur.BytesPerSec = v
		case "latency":
			cur.LatencyNs = v
		case "msg_size":
			cur.MsgSize = int(v)
		case "msg_rate":
			cur.MsgRate = v
		case "time":
			cur.Seconds = v / 1e9
		case "recv_bytes", "loc_recv_bytes":
			cur.RecvBytes = v
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, errors.New("parse qperf output: no test result (empty output)")
	}
	return res, sc.Err()
}
