package clusterdns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

type fakeSource struct {
	svcs   map[string]*corev1.Service
	slices map[string][]*discoveryv1.EndpointSlice
}

func (f fakeSource) Service(ns, name string) (*corev1.Service, error) {
	if s, ok := f.svcs[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("service %s/%s not found", ns, name)
}

func (f fakeSource) Services() ([]*corev1.Service, error) {
	var out []*corev1.Service
	for _, s := range f.svcs {
		out = append(out, s)
	}
	return out, nil
}

func (f fakeSource) EndpointSlices(ns, svc string) ([]*discoveryv1.EndpointSlice, error) {
	return f.slices[ns+"/"+svc], nil
}

func testSource() fakeSource {
	yes, no, h := true, false, "web-0"
	httpName, port8080 := "http", int32(8080)
	return fakeSource{
		svcs: map[string]*corev1.Service{
			"default/web": {ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20", "fd00:10:96::20"},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
			"default/hl": {ObjectMeta: metav1.ObjectMeta{Name: "hl", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "None",
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
			"default/ext":  {ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "default"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}},
			"default/none": {ObjectMeta: metav1.ObjectMeta{Name: "none", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "None"}},
		},
		slices: map[string][]*discoveryv1.EndpointSlice{"default/hl": {{Ports: []discoveryv1.EndpointPort{{Name: &httpName, Port: &port8080}}, Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, Hostname: &h, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.2.6"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.2.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}}, // not ready: not published
		}}}},
	}
}

func query(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 42, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// parse returns the response's rcode and its answers as strings (IPs or CNAME targets).
func parse(t *testing.T, resp []byte) (dnsmessage.RCode, []string) {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("unpack response: %v", err)
	}
	if m.ID != 42 || !m.Response {
		t.Fatalf("response header %+v: want ID 42, a response", m.Header)
	}
	var out []string
	for _, a := range m.Answers {
		switch r := a.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(r.A).String())
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(r.AAAA).String())
		case *dnsmessage.SRVResource:
			out = append(out, fmt.Sprintf("SRV %s:%d", r.Target, r.Port))
		case *dnsmessage.PTRResource:
			out = append(out, "PTR "+r.PTR.String())
		case *dnsmessage.CNAMEResource:
			out = append(out, "CNAME "+r.CNAME.String())
		}
	}
	return m.RCode, out
}

func TestAnswer(t *testing.T) {
	s := New("", testSource(), slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		want  []string
	}{
		{"web.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.0.20"}},
		{"WEB.default.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"fd00:10:96::20"}},
		{"hl.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.5", "10.244.2.6"}},
		{"web-0.hl.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.5"}},
		{"web-1.hl.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"none.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, nil}, // headless without endpoints
		{"ext.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"CNAME example.org."}},
		{"10-244-1-5.default.pod.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.5"}},
		{"nope.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"web.other.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"example.org.", dnsmessage.TypeA, dnsmessage.RCodeRefused, nil},
		{"svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, nil},
		{"_http._tcp.web.default.svc.cluster.local.", dnsmessage.TypeSRV, dnsmessage.RCodeSuccess, []string{"SRV web.default.svc.cluster.local.:80"}},
		{"_http._tcp.hl.default.svc.cluster.local.", dnsmessage.TypeSRV, dnsmessage.RCodeSuccess, []string{"SRV web-0.hl.default.svc.cluster.local.:8080", "SRV 10-244-2-6.hl.default.svc.cluster.local.:8080"}},
		{"_dns._udp.web.default.svc.cluster.local.", dnsmessage.TypeSRV, dnsmessage.RCodeNameError, nil},
		{"20.0.96.10.in-addr.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeSuccess, []string{"PTR web.default.svc.cluster.local."}},
		{"21.0.96.10.in-addr.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeRefused, nil},
	} {
		t.Run(tc.name+"/"+tc.typ.String(), func(t *testing.T) {
			rcode, got := parse(t, s.Answer(query(t, tc.name, tc.typ)))
			if rcode != tc.rcode || !slices.Equal(got, tc.want) {
				t.Errorf("%s %s: %s %v, want %s %v", tc.typ, tc.name, rcode, got, tc.rcode, tc.want)
			}
		})
	}
	if s.Answer([]byte{1, 2, 3}) != nil {
		t.Error("a malformed query got an answer")
	}
}

// TestServeInNetns: a resolver inside a netns, over UDP and over TCP, gets the Service's
// address from the server listening in that netns (the root netns has no server there).
func TestServeInNetns(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	name := "axt-dns-" + testutil.RandSuffix(t)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	s := New("cluster.local", testSource(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeInNetns(ctx, []string{netnsutil.Path(name)}, "127.0.0.53:53") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var c net.Conn
			err := netnsutil.Do(name, func() (err error) {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, "127.0.0.53:53")
				return err
			})
			return c, err
		}}
		var got []string
		var err error
		for range 50 { // the listeners come up asynchronously: a query sent before gets "refused"
			ctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			got, err = r.LookupHost(ctx, "web.default.svc.cluster.local")
			c()
			if err == nil && len(got) == 2 { // the A and the AAAA query both answered
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		slices.Sort(got)
		if err != nil || !slices.Equal(got, []string{"10.96.0.20", "fd00:10:96::20"}) {
			t.Errorf("%s: LookupHost web.default.svc.cluster.local = %v, %v; want 10.96.0.20 and fd00:10:96::20", network, got, err)
		}
	}
}

// TestServeRepliesFromTheQueriedAddress: a server listening on the wildcard address answers
// from the address the query was sent to, whatever source the route back would pick. A pod of
// the ptp baseline asks its node's IP, and the route back to it prefers the host-side veth's
// address: without this its resolver (a connected socket) drops the answer and the lookup times
// out ("Temporary failure in name resolution" in the baseline's conformance run).
func TestServeRepliesFromTheQueriedAddress(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	name := "axt-dns-" + testutil.RandSuffix(t)
	for _, args := range [][]string{
		{"netns", "add", name},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		{"-n", name, "link", "set", "v0", "up"},
		{"-n", name, "addr", "add", "198.18.0.11/32", "dev", "v0"}, // the node's IP: what pods ask
		{"-n", name, "addr", "add", "10.245.1.16/32", "dev", "v0"}, // the pod's: the source of the route back
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		if args[0] == "netns" {
			t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
		}
	}
	s := New("cluster.local", testSource(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeInNetns(ctx, []string{netnsutil.Path(name)}, "0.0.0.0:53") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var c net.Conn
		err := netnsutil.Do(name, func() (err error) {
			d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP("10.245.1.16")}}
			c, err = d.DialContext(ctx, "udp", "198.18.0.11:53")
			return err
		})
		return c, err
	}}
	var got []string
	var err error
	for range 20 { // the listener comes up asynchronously: a query sent before is refused
		lctx, c := context.WithTimeout(context.Background(), time.Second)
		got, err = r.LookupHost(lctx, "web.default.svc.cluster.local")
		c()
		if err == nil && len(got) == 2 { // the A and the AAAA query both answered
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(got)
	if err != nil || !slices.Equal(got, []string{"10.96.0.20", "fd00:10:96::20"}) {
		t.Errorf("from 10.245.1.16 to 198.18.0.11:53: LookupHost = %v, %v; want 10.96.0.20 and fd00:10:96::20", got, err)
	}
}
