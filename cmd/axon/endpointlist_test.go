package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/api"
)

// endpointsOnly is an agent API that answers GET /v1/endpoints only.
type endpointsOnly struct{ eps []api.Endpoint }

var errNotHere = errors.New("not served by this test")

func (h endpointsOnly) Healthy(context.Context) error              { return nil }
func (h endpointsOnly) Status(context.Context) (api.Status, error) { return api.Status{}, errNotHere }
func (h endpointsOnly) Endpoints(context.Context) ([]api.Endpoint, error) {
	return h.eps, nil
}
func (h endpointsOnly) Allocate(context.Context, api.AllocateRequest) (api.AllocateResponse, error) {
	return api.AllocateResponse{}, errNotHere
}
func (h endpointsOnly) Release(context.Context, api.ReleaseRequest) error    { return errNotHere }
func (h endpointsOnly) PutEndpoint(context.Context, api.Endpoint) error      { return errNotHere }
func (h endpointsOnly) DeleteEndpoint(context.Context, api.Attachment) error { return errNotHere }
func (h endpointsOnly) GC(context.Context, api.GCRequest) (api.GCResponse, error) {
	return api.GCResponse{}, errNotHere
}

func endpointList(t *testing.T, eps []api.Endpoint) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "axon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(api.NewMux(endpointsOnly{eps}, nil))
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"endpoint", "list", "--socket", sock})
	if err := root.Execute(); err != nil {
		t.Fatalf("axon endpoint list: %v\n%s", err, out.String())
	}
	return out.String()
}

// TestEndpointListVMBypass: the VM BYPASS column appears only when some pod
// asked for the VM-pod bridge bypass, with "-" for the others.
func TestEndpointListVMBypass(t *testing.T) {
	ep := func(name, vm string) api.Endpoint {
		return api.Endpoint{PodNamespace: "default", PodName: name, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")},
			HostIfName: "lxc" + name, HostIfIndex: 7, State: "ready", ContainerID: "c" + name, VMBypass: vm}
	}
	plain := endpointList(t, []api.Endpoint{ep("web", "")})
	if strings.Contains(plain, "VM BYPASS") {
		t.Errorf("column shown without VM pods:\n%s", plain)
	}
	out := endpointList(t, []api.Endpoint{ep("vm", "bypassed"), ep("web", ""), ep("vm2", "not bypassed: no_tap")})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "VM BYPASS") {
		t.Fatalf("output:\n%s", out)
	}
	for _, want := range []struct{ pod, cell string }{{"default/vm ", "bypassed"}, {"default/vm2", "not bypassed: no_tap"}, {"default/web", "-"}} {
		found := false
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, want.pod) && strings.HasSuffix(strings.TrimSpace(l), want.cell) {
				found = true
			}
		}
		if !found {
			t.Errorf("no row %s ... %s in:\n%s", want.pod, want.cell, out)
		}
	}
	t.Log("\n" + out)
}

// TestEndpointListPodLB: the POD LB column appears only when some pod's
// sockets the socket LB skips, with "-" for the others.
func TestEndpointListPodLB(t *testing.T) {
	ep := func(name, plb string) api.Endpoint {
		return api.Endpoint{PodNamespace: "default", PodName: name, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")},
			HostIfName: "lxc" + name, HostIfIndex: 7, State: "ready", ContainerID: "c" + name, PodLB: plb}
	}
	if plain := endpointList(t, []api.Endpoint{ep("web", "")}); strings.Contains(plain, "POD LB") {
		t.Errorf("column shown without such pods:\n%s", plain)
	}
	out := endpointList(t, []api.Endpoint{ep("mesh", "attached"), ep("web", ""), ep("vm", "attached, replies at tap0")})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "POD LB") {
		t.Fatalf("output:\n%s", out)
	}
	for _, want := range []struct{ pod, cell string }{{"default/mesh", "attached"}, {"default/vm ", "attached, replies at tap0"}, {"default/web", "-"}} {
		if !slices.ContainsFunc(lines[1:], func(l string) bool {
			return strings.HasPrefix(l, want.pod) && strings.HasSuffix(strings.TrimSpace(l), want.cell)
		}) {
			t.Errorf("no row %s ... %s in:\n%s", want.pod, want.cell, out)
		}
	}
}
