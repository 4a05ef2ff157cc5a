// Package sysdump collects what a bug report about an axon node needs into
// one tar.gz: the agent's state through its local API (status, endpoints,
// Services, the LB, bandwidth and bypass tables), its /metrics, its command
// line, every map pinned under --bpf-root (bounded), the BPF programs and
// links in the kernel, the kernel version and the probes' findings, the
// kernel log's tail and the agent's logs when given.
//
// Each part is collected on its own: a part that fails (agent down, map not
// readable, dmesg restricted) becomes an "<member>.error" file saying why,
// and the archive is still written. Nothing secret goes in: no kubeconfig,
// no environment, no service-account token; flag values whose names say
// token, password or secret are replaced by "<redacted>".
package sysdump

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
)

// Options says where the agent and its traces are.
type Options struct {
	Socket     string // the agent's local API socket
	HealthAddr string // host:port of the agent's /metrics; empty: skip
	// DialHealth dials HealthAddr (nil: a plain TCP dial). Tests pass one
	// that dials inside the node's network namespace.
	DialHealth func(ctx context.Context, network, addr string) (net.Conn, error)
	BPFRoot    string // the agent's --bpf-root
	// MaxMapEntries bounds each pinned map's dump (entries past it are
	// counted, not written); MaxLogBytes bounds each log's tail.
	MaxMapEntries int
	MaxLogBytes   int64
	AgentLog      string // a file with the agent's log; empty: none
	JournalUnit   string // a systemd unit whose journal has the agent's log; empty: none
	Now           func() time.Time
}

// Defaults for the bounds.
const (
	DefaultMaxMapEntries = 1000
	DefaultMaxLogBytes   = 8 << 20
	dmesgTailLines       = 2000
)

// archive writes members into a tar.gz with one fixed mtime.
type archive struct {
	tw     *tar.Writer
	prefix string
	mtime  time.Time
	names  []string
}

func (a *archive) add(name string, data []byte) error {
	a.names = append(a.names, name)
	return a.write(name, data)
}

func (a *archive) write(name string, data []byte) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: a.prefix + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: a.mtime}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := a.tw.Write(data)
	return err
}

// part adds name with the output of f, or name.error with f's error.
func (a *archive) part(name string, f func() ([]byte, error)) error {
	data, err := f()
	if err != nil {
		msg := err.Error() + "\n"
		if len(data) > 0 { // partial output is kept too
			if werr := a.add(name, data); werr != nil {
				return werr
			}
		}
		return a.add(name+".error", []byte(msg))
	}
	return a.add(name, data)
}

// Write collects everything and writes the tar.gz to w. It fails only when
// w does; what could not be collected is in the archive's *.error files.
func Write(ctx context.Context, w io.Writer, o Options) error {
	if o.MaxMapEntries <= 0 {
		o.MaxMapEntries = DefaultMaxMapEntries
	}
	if o.MaxLogBytes <= 0 {
		o.MaxLogBytes = DefaultMaxLogBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	now := o.Now().UTC()
	gz := gzip.NewWriter(w)
	a := &archive{tw: tar.NewWriter(gz), prefix: "axon-sysdump-" + now.Format("20060102-150405"), mtime: now}
	c := api.NewClient(o.Socket)

	var status *api.Status
	steps := []struct {
		name string
		f    func() ([]byte, error)
	}{
		{"status.json", func() ([]byte, error) {
			st, err := c.Status(ctx)
			if err != nil {
				return nil, fmt.Errorf("agent status over %s: %w", o.Socket, err)
			}
			status = &st
			return indent(st)
		}},
		{"endpoints.json", func() ([]byte, error) { return apiPart(c.Endpoints(ctx)) }},
		{"services.json", func() ([]byte, error) { return apiPart(c.Services(ctx)) }},
		{"bpf-lb.json", func() ([]byte, error) { return apiPart(c.LBMaps(ctx)) }},
		{"bpf-ct.json", func() ([]byte, error) { return apiPart(c.CT(ctx)) }},
		{"bpf-nat.json", func() ([]byte, error) { return apiPart(c.NAT(ctx)) }},
		{"bpf-bandwidth.json", func() ([]byte, error) { return apiPart(c.BandwidthMaps(ctx)) }},
		{"bpf-sockmap.json", func() ([]byte, error) { return apiPart(c.SockmapConns(ctx)) }},
		{"agent-cmdline.txt", func() ([]byte, error) { return agentCmdline(ctx, o.Socket) }},
		{"metrics.txt", func() ([]byte, error) { return metrics(ctx, o) }},
		{"kernel.txt", func() ([]byte, error) { return kernel(status) }},
		{"bpf-programs.txt", programs},
		{"bpf-links.txt", links},
		{"dmesg.txt", dmesg},
	}
	for _, s := range steps {
		if err := a.part(s.name, s.f); err != nil {
			return err
		}
	}
	if err := pinned(a, o); err != nil {
		return err
	}
	if o.AgentLog != "" {
		if err := a.part("agent.log", func() ([]byte, error) { return tailFile(o.AgentLog, o.MaxLogBytes) }); err != nil {
			return err
		}
	}
	if o.JournalUnit != "" {
		if err := a.part("agent-journal.log", func() ([]byte, error) { return journal(ctx, o.JournalUnit, o.MaxLogBytes) }); err != nil {
			return err
		}
	}
	members := append([]string{"MEMBERS.txt"}, a.names...)
	sort.Strings(members[1:])
	readme := fmt.Sprintf("axon sysdump %s\nsocket %s, metrics %s, bpf-root %s, at most %d entries per map, %d bytes per log\n\n%s\n",
		now.Format(time.RFC3339), o.Socket, o.HealthAddr, o.BPFRoot, o.MaxMapEntries, o.MaxLogBytes, strings.Join(members, "\n"))
	if err := a.write("MEMBERS.txt", []byte(readme)); err != nil {
		return err
	}
	if err := a.tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func indent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return append(b, '\n'), err
}

func apiPart[T any](v T, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return indent(v)
}

// secretFlag matches flag names whose values must not leave the node.
var secretFlag = regexp.MustCompile(`(?i)token|passw|secret|credential`)

// agentCmdline reads the command line of the process serving socket (the
// kernel names it: SO_PEERCRED), with secret-looking values redacted.
func agentCmdline(ctx context.Context, socket string) ([]byte, error) {
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", socket, err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_PEERCRED on %s: %w", socket, serr)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid))
	if err != nil {
		return nil, fmt.Errorf("agent pid %d (another PID namespace?): %w", cred.Pid, err)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	var out strings.Builder
	fmt.Fprintf(&out, "pid %d uid %d gid %d\n", cred.Pid, cred.Uid, cred.Gid)
	for _, a := range redactArgs(args) {
		fmt.Fprintln(&out, a)
	}
	return []byte(out.String()), nil
}

// redactArgs replaces the values of flags named like secrets
// (--token=x, --token x, -password x).
func redactArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if strings.HasPrefix(arg, "-") && secretFlag.MatchString(name) {
			if hasValue {
				arg = arg[:strings.Index(arg, "=")+1] + "<redacted>"
			} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				out = append(out, arg)
				arg = "<redacted>"
				i++
			}
		}
		out = append(out, arg)
	}
	return out
}

func metrics(ctx context.Context, o Options) ([]byte, error) {
	if o.HealthAddr == "" {
		return nil, errors.New("no --health-addr given: metrics not collected")
	}
	dial := o.DialHealth
	if dial == nil {
		dial = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.HealthAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics at %s: %w (pass the agent's --health-addr)", o.HealthAddr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET /metrics at %s: %s", o.HealthAddr, resp.Status)
	}
	return b, err
}

// kernel is uname, /proc/version and the probes the agent ran at start
// (its status; the CLI runs no probe itself: probes create devices).
func kernel(st *api.Status) ([]byte, error) {
	var u unix.Utsname
	var b bytes.Buffer
	if err := unix.Uname(&u); err == nil {
		fmt.Fprintf(&b, "uname: %s %s %s %s\n", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]),
			unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	if v, err := os.ReadFile("/proc/version"); err == nil {
		b.Write(v)
	}
	if st == nil {
		return b.Bytes(), errors.New("kernel probes: the agent's status was not readable (see status.json.error)")
	}
	fmt.Fprintln(&b, "\nkernel features (the agent's probes at start):")
	for _, f := range st.Features {
		fmt.Fprintf(&b, "  %-20s %-5t %s\n", f.Name, f.Available, f.Reason)
	}
	fmt.Fprintln(&b, "\ndatapath decisions:")
	for _, d := range st.Datapath {
		fmt.Fprintf(&b, "  %-20s %-10s %s\n", d.Name, d.Value, d.Reason)
	}
	return b.Bytes(), nil
}

// programs lists every BPF program loaded in the kernel.
func programs() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintln(&b, "ID\tTYPE\tNAME\tTAG\tMAPS")
	var errs []error
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return b.Bytes(), fmt.Errorf("list programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			errs = append(errs, fmt.Errorf("program %d: %w", id, err))
			continue
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("program %d info: %w", id, err))
			continue
		}
		maps, _ := info.MapIDs()
		fmt.Fprintf(&b, "%d\t%s\t%s\t%s\t%v\n", id, info.Type, info.Name, info.Tag, maps)
	}
	return b.Bytes(), errors.Join(errs...)
}

// links lists every BPF link: type, program and where it is attached.
func links() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintln(&b, "ID\tTYPE\tPROGRAM\tATTACHED")
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			fmt.Fprintf(&b, "%d\t?\t?\t%v\n", it.ID, err)
			continue
		}
		where := ""
		switch {
		case info.TCX() != nil:
			where = fmt.Sprintf("tcx ifindex %d %v", info.TCX().Ifindex, info.TCX().AttachType)
		case info.Netkit() != nil:
			where = fmt.Sprintf("netkit ifindex %d %v", info.Netkit().Ifindex, info.Netkit().AttachType)
		case info.XDP() != nil:
			where = fmt.Sprintf("xdp ifindex %d", info.XDP().Ifindex)
		case info.Cgroup() != nil:
			where = fmt.Sprintf("cgroup id %d %v", info.Cgroup().CgroupId, info.Cgroup().AttachType)
		case info.NetNs() != nil:
			where = fmt.Sprintf("netns ino %d %v", info.NetNs().NetnsInode, info.NetNs().AttachType)
		}
		fmt.Fprintf(&b, "%d\t%v\t%d\t%s\n", info.ID, info.Type, info.Program, where)
	}
	return b.Bytes(), it.Err()
}

// pinned dumps every object pinned under the BPF root: maps (info and at
// most MaxMapEntries entries, hex), links and programs (info).
func pinned(a *archive, o Options) error {
	if o.BPFRoot == "" {
		return a.add("bpf-pinned.error", []byte("no --bpf-root given\n"))
	}
	var list bytes.Buffer
	err := filepath.WalkDir(o.BPFRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			hint := ""
			if p == o.BPFRoot {
				hint = " (pass the agent's --bpf-root)"
			}
			fmt.Fprintf(&list, "%s\terror: %v%s\n", p, err, hint)
			return nil
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(o.BPFRoot, p)
		if m, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			fmt.Fprintf(&list, "%s\tmap\n", rel)
			data, derr := dumpMap(m, o.MaxMapEntries)
			m.Close()
			return a.part(filepath.Join("bpf-maps", rel+".txt"), func() ([]byte, error) { return data, derr })
		}
		if l, err := link.LoadPinnedLink(p, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			info, ierr := l.Info()
			l.Close()
			if ierr != nil {
				fmt.Fprintf(&list, "%s\tlink\t%v\n", rel, ierr)
			} else {
				fmt.Fprintf(&list, "%s\tlink\tid %d type %v program %d\n", rel, info.ID, info.Type, info.Program)
			}
			return nil
		}
		if pr, err := ebpf.LoadPinnedProgram(p, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			info, ierr := pr.Info()
			pr.Close()
			if ierr != nil {
				fmt.Fprintf(&list, "%s\tprogram\t%v\n", rel, ierr)
			} else {
				fmt.Fprintf(&list, "%s\tprogram\t%s %s\n", rel, info.Type, info.Name)
			}
			return nil
		}
		fmt.Fprintf(&list, "%s\tnot a BPF object (or not readable)\n", rel)
		return nil
	})
	if err != nil {
		return err
	}
	return a.add("bpf-pinned.txt", list.Bytes())
}

// dumpMap writes a map's info and up to max entries as hex; per-CPU
// values are one hex string per CPU. Entries past max are counted.
func dumpMap(m *ebpf.Map, max int) ([]byte, error) {
	var b bytes.Buffer
	info, err := m.Info()
	name := ""
	if err == nil {
		name = info.Name
	}
	fmt.Fprintf(&b, "name %s type %s key %d value %d max_entries %d flags %#x\n", name, m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), m.Flags())
	switch m.Type() {
	case ebpf.SockHash, ebpf.SockMap, ebpf.ProgramArray, ebpf.PerfEventArray, ebpf.RingBuf, ebpf.ArrayOfMaps, ebpf.HashOfMaps, ebpf.DevMap, ebpf.DevMapHash, ebpf.CPUMap, ebpf.XSKMap:
		fmt.Fprintln(&b, "(values of this map type are not readable from user space: keys only)")
		return b.Bytes(), dumpKeys(&b, m, max)
	}
	key := make([]byte, m.KeySize())
	n, more := 0, 0
	it := m.Iterate()
	if perCPU(m.Type()) {
		var vals [][]byte
		for it.Next(&key, &vals) {
			if n >= max {
				more++
				continue
			}
			n++
			fmt.Fprintf(&b, "%s:", hex.EncodeToString(key))
			for _, v := range vals {
				fmt.Fprintf(&b, " %s", hex.EncodeToString(v))
			}
			b.WriteByte('\n')
		}
	} else {
		val := make([]byte, m.ValueSize())
		for it.Next(&key, &val) {
			if n >= max {
				more++
				continue
			}
			n++
			fmt.Fprintf(&b, "%s: %s\n", hex.EncodeToString(key), hex.EncodeToString(val))
		}
	}
	fmt.Fprintf(&b, "%d entries written", n)
	if more > 0 {
		fmt.Fprintf(&b, ", %d more not written (limit %d per map: --max-map-entries)", more, max)
	}
	b.WriteByte('\n')
	return b.Bytes(), it.Err()
}

func dumpKeys(b *bytes.Buffer, m *ebpf.Map, max int) error {
	key := make([]byte, m.KeySize())
	n := 0
	var err error
	for n < max {
		var next []byte = make([]byte, m.KeySize())
		var k any = key
		if n == 0 {
			k = nil
		}
		if err = m.NextKey(k, &next); err != nil {
			break
		}
		fmt.Fprintf(b, "%s\n", hex.EncodeToString(next))
		copy(key, next)
		n++
	}
	fmt.Fprintf(b, "%d keys written (limit %d)\n", n, max)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// dmesg is the kernel log's last lines (syslog(2); fails when
// kernel.dmesg_restrict forbids it).
func dmesg() ([]byte, error) {
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil {
		return nil, fmt.Errorf("kernel log size: %w (kernel.dmesg_restrict? run as root)", err)
	}
	buf := make([]byte, n)
	n, err = unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return nil, fmt.Errorf("read the kernel log: %w (kernel.dmesg_restrict? run as root)", err)
	}
	lines := strings.SplitAfter(string(buf[:n]), "\n")
	if len(lines) > dmesgTailLines {
		lines = lines[len(lines)-dmesgTailLines:]
	}
	return []byte(strings.Join(lines, "")), nil
}

func tailFile(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// journal is the unit's journal tail (journalctl; a CLI, not the agent,
// runs it).
func journal(ctx context.Context, unit string, max int64) ([]byte, error) {
	if strings.HasPrefix(unit, "-") {
		return nil, fmt.Errorf("journal unit %q: a unit name, not an option", unit)
	}
	out, err := exec.CommandContext(ctx, "journalctl", "--no-pager", "-o", "short-iso", "-n", "20000", "-u", unit).Output()
	if int64(len(out)) > max {
		out = out[int64(len(out))-max:]
	}
	if err != nil {
		return out, fmt.Errorf("journalctl -u %s: %w", unit, err)
	}
	return out, nil
}

func perCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}
