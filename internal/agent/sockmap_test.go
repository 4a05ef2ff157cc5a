package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath/sockmap"
)

// TestDecideSockmap: the admission rule over the Pod's and the Namespace's
// annotations; an invalid value keeps the previous decision and is reported
// on the object that carries it.
func TestDecideSockmap(t *testing.T) {
	const egress, ingress = "kubernetes.io/egress-bandwidth", "kubernetes.io/ingress-bandwidth"
	ann := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name       string
		pod, ns    map[string]string
		want       verdict
		whyHas     string
		podErr     bool // an Event on the Pod
		nsErr      bool // an Event on the Namespace
		errMention string
	}{
		{name: "no annotations", want: verdictAdmit},
		{name: "namespace unknown", pod: ann(), ns: nil, want: verdictAdmit},
		{name: "pod enabled", pod: ann(AnnotationSockmap, "enabled"), want: verdictAdmit},
		{name: "pod disabled", pod: ann(AnnotationSockmap, "disabled"), want: verdictDeny, whyHas: "pod annotation axon.io/sockmap=disabled"},
		{name: "pod disabled, spaces", pod: ann(AnnotationSockmap, " disabled "), want: verdictDeny, whyHas: "pod annotation"},
		{name: "namespace disabled", ns: ann(AnnotationSockmap, "disabled"), want: verdictDeny, whyHas: "namespace annotation axon.io/sockmap=disabled"},
		{name: "namespace enabled", ns: ann(AnnotationSockmap, "enabled"), want: verdictAdmit},
		{name: "pod enabled overrides namespace disabled", pod: ann(AnnotationSockmap, "enabled"), ns: ann(AnnotationSockmap, "disabled"), want: verdictAdmit},
		{name: "pod disabled in an enabled namespace", pod: ann(AnnotationSockmap, "disabled"), ns: ann(AnnotationSockmap, "enabled"), want: verdictDeny, whyHas: "pod annotation"},
		{name: "egress limit", pod: ann(egress, "10M"), want: verdictDeny, whyHas: egress},
		{name: "ingress limit", pod: ann(ingress, "1G"), want: verdictDeny, whyHas: ingress},
		{name: "limit beats pod enabled", pod: ann(AnnotationSockmap, "enabled", egress, "10M"), want: verdictDeny, whyHas: "enforced on the TCP/IP stack path"},
		{name: "invalid limit still a limit", pod: ann(ingress, "fast"), want: verdictDeny, whyHas: ingress},
		{name: "pod invalid", pod: ann(AnnotationSockmap, "off"), want: verdictKeep, whyHas: "invalid pod annotation", podErr: true, errMention: `"off"`},
		{name: "pod empty value", pod: ann(AnnotationSockmap, ""), want: verdictKeep, podErr: true, errMention: `""`},
		{name: "pod wrong case", pod: ann(AnnotationSockmap, "Disabled"), want: verdictKeep, podErr: true, errMention: `"Disabled"`},
		{name: "pod invalid, namespace disabled", pod: ann(AnnotationSockmap, "no"), ns: ann(AnnotationSockmap, "disabled"), want: verdictKeep, podErr: true},
		{name: "namespace invalid", ns: ann(AnnotationSockmap, "sometimes"), want: verdictKeep, whyHas: "invalid namespace annotation", nsErr: true, errMention: `"sometimes"`},
		{name: "namespace invalid, pod decides", pod: ann(AnnotationSockmap, "disabled"), ns: ann(AnnotationSockmap, "sometimes"), want: verdictDeny, nsErr: true},
		{name: "both invalid, limit decides", pod: ann(AnnotationSockmap, "x", egress, "1M"), ns: ann(AnnotationSockmap, "y"), want: verdictDeny, podErr: true, nsErr: true},
		{name: "socket LB opt-out is another switch", pod: ann(AnnotationSocketLB, "disabled"), want: verdictAdmit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, why, errs := decideSockmap(tt.pod, tt.ns)
			if v != tt.want || !strings.Contains(why, tt.whyHas) {
				t.Errorf("verdict %d (%q), want %d with %q", v, why, tt.want, tt.whyHas)
			}
			var podErr, nsErr bool
			for _, e := range errs {
				if e.onNamespace {
					nsErr = true
				} else {
					podErr = true
				}
				msg := e.err.Error()
				if !strings.Contains(msg, tt.errMention) || !strings.Contains(msg, `use "disabled"`) || !strings.Contains(msg, "changes nothing") {
					t.Errorf("error %q does not name the value %s, what happens and what to use", msg, tt.errMention)
				}
			}
			if podErr != tt.podErr || nsErr != tt.nsErr {
				t.Errorf("errors on pod %v, namespace %v; want %v, %v (%v)", podErr, nsErr, tt.podErr, tt.nsErr, errs)
			}
		})
	}
}

func TestValidateSockmap(t *testing.T) {
	for _, tt := range []struct {
		v       string
		wantErr bool
	}{{SockmapEnabled, false}, {SockmapDisabled, false}, {"", false}, {"on", true}, {"Enabled", true}} {
		err := Config{Sockmap: tt.v}.validateSockmap()
		if (err != nil) != tt.wantErr {
			t.Errorf("--sockmap %q: %v, want error %v", tt.v, err, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "use enabled") {
			t.Errorf("--sockmap %q: error %q does not say what is allowed", tt.v, err)
		}
	}
	// opt in: the splice guard costs every read(2)/write(2) of the node
	if d := Defaults(); d.Sockmap != SockmapDisabled {
		t.Errorf("default --sockmap %q, want %s", d.Sockmap, SockmapDisabled)
	}
}

// TestSockmapGate: the bypass turns on only after the kernel self-test
// passed and the load worked; otherwise status says why it is off, and
// nothing is loaded after a failed self-test.
func TestSockmapGate(t *testing.T) {
	loadErr := errors.New("attach sock_ops to cgroup /x: operation not permitted")
	tests := []struct {
		name       string
		flag       string
		selfTest   string // "" = passes
		wantTests  int
		wantLoads  int
		wantValue  string
		wantReason string
	}{
		{name: "flag disabled", flag: SockmapDisabled, wantValue: "off", wantReason: "--sockmap=disabled"},
		{name: "flag not set", flag: "", wantValue: "off", wantReason: "--sockmap not set"},
		{name: "self-test fails", flag: SockmapEnabled, selfTest: "FIONREAD of stack bytes is 0", wantTests: 1,
			wantValue: "off", wantReason: "the kernel self-test did not pass, every connection takes the TCP/IP stack: FIONREAD of stack bytes is 0"},
		{name: "load fails", flag: SockmapEnabled, wantTests: 1, wantLoads: 2, wantValue: "off", wantReason: "load failed, every connection takes the TCP/IP stack: attach sock_ops"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSockBypass(Config{Sockmap: tt.flag, BPFRoot: t.TempDir()}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, func() *kube { return nil })
			tests, loads := 0, 0
			s.selfTest = func(context.Context) sockmap.Result {
				tests++
				r := sockmap.Result{OK: tt.selfTest == "", Reason: tt.selfTest, StreamVerdict: true,
					Checks: []sockmap.Check{{Name: "fionread", OK: tt.selfTest == "", Detail: "2000 of 2000"}}}
				return r
			}
			var verdicts []bool
			s.load = func(v bool) (bypassMaps, string, error) {
				loads++
				verdicts = append(verdicts, v)
				return nil, "", loadErr
			}
			if d := s.decision(s.status()); d.Value != "pending" && tt.flag == SockmapEnabled {
				t.Errorf("before the first pass: %+v, want pending", d)
			}
			s.ensure(t.Context())
			s.ensure(t.Context()) // a second pass: the self-test runs once, a failed load is retried
			d := s.decision(s.status())
			if d.Name != DecisionSockmap || d.Value != tt.wantValue || !strings.Contains(d.Reason, tt.wantReason) {
				t.Errorf("decision %+v, want %s with %q", d, tt.wantValue, tt.wantReason)
			}
			if tests != tt.wantTests || loads != tt.wantLoads {
				t.Errorf("self-test ran %d times, load %d; want %d, %d", tests, loads, tt.wantTests, tt.wantLoads)
			}
			for _, v := range verdicts {
				if !v {
					t.Errorf("loaded without the stream verdict the self-test asked for")
				}
			}
			if st := s.status(); tt.wantTests == 1 && (len(st.SelfTestChecks) != 1 || !strings.HasPrefix(st.SelfTestChecks[0], "fionread: ")) {
				t.Errorf("status self-test checks %q, want the one check", st.SelfTestChecks)
			}
			rep, err := s.conns()
			if err != nil || rep.Enabled || rep.Reason == "" || rep.Conns == nil {
				t.Errorf("connection list while off: %+v, %v; want disabled with a reason", rep, err)
			}
		})
	}
}
