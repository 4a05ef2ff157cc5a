package vmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLabDeviceCheck runs the LabDevice step's shell function (for two nodes)
// against canned `axon status` outputs: it must pass only when the agent's
// decision and the pods' devices are what the kernel's netkit probe calls for.
func TestLabDeviceCheck(t *testing.T) {
	const (
		vethStatus = `  device             veth                 configured auto, veth because netkit: creating a netkit device failed
  pod_devices        2 veth               --device-mode=auto applies to new pods; existing pods keep their device until recreated
  netkit              no   netkit: creating a netkit device failed (CONFIG_NETKIT unset?): operation not supported`
		netkitStatus = `  device             netkit l3            configured auto: netkit: device created (probed)
  pod_devices        2 netkit-l3          --device-mode=auto applies to new pods; existing pods keep their device until recreated
  netkit              yes  netkit: device created (probed)`
		mixedStatus = `  device             netkit l3            configured auto: netkit: device created (probed)
  pod_devices        1 netkit-l3, 1 veth  --device-mode=auto applies to new pods; existing pods keep their device until recreated
  netkit              yes  netkit: device created (probed)`
		vethOnNetkitKernel = `  device             veth                 configured veth
  pod_devices        2 veth               --device-mode=veth applies to new pods; existing pods keep their device until recreated
  netkit              yes  netkit: device created (probed)`
	)
	for _, tc := range []struct {
		name, device, status string
		ok                   bool
	}{
		{"auto without netkit is veth", "auto", vethStatus, true},
		{"auto with netkit is netkit", "auto", netkitStatus, true},
		{"auto with netkit but veth pods fails", "auto", vethOnNetkitKernel, false},
		{"a veth pod left among netkit pods fails", "auto", mixedStatus, false},
		{"veth asked, veth given", "veth", vethOnNetkitKernel, true},
		{"netkit asked, netkit given", "netkit", netkitStatus, true},
		{"netkit asked, veth given", "netkit", vethStatus, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "status.txt"), []byte(tc.status+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			fake := filepath.Join(dir, "axon")
			if err := os.WriteFile(fake, []byte("#!/bin/sh\ncat "+filepath.Join(dir, "status.txt")+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", labDeviceFunc+"labdevice "+tc.device+" 2")
			cmd.Env = append(os.Environ(), "AXON_BIN="+fake)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Errorf("labdevice %s: err %v, want ok=%v\n%s", tc.device, err, tc.ok, out)
			}
		})
	}
}

// TestRunScriptLabAndEnv: the lab subset gets --device (auto by default) and
// the LabDevice step; -env values are exported quoted; the script is valid sh.
func TestRunScriptLabAndEnv(t *testing.T) {
	r := &Runner{labBins: true, Env: []string{"AXON_NK_BENCH_REPS=30", "AXON_X=a b'c"}}
	s := r.RunScript(nil)
	path := filepath.Join(t.TempDir(), "run.sh")
	if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	for _, want := range []string{"export AXON_NK_BENCH_REPS='30'", `export AXON_X='a b'\''c'`,
		"axon lab up --nodes 1 --pods-per-node 2 --device 'auto'", "labstep LabDevice labdevice 'auto' 1"} {
		if !strings.Contains(s, want) {
			t.Errorf("run.sh lacks %s:\n%s", want, s)
		}
	}
	r.LabDevice, r.LabNodes = "netkit", 2
	if s := r.RunScript(nil); !strings.Contains(s, "--nodes 2 --pods-per-node 2 --device 'netkit'") || strings.Contains(s, "@DEVICE@") || strings.Contains(s, "@NODES@") {
		t.Errorf("LabDevice netkit not in run.sh:\n%s", s)
	}
}
