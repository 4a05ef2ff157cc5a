package podpath

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestAttachUnderTraffic attaches and detaches the pod program while UDP
// round trips run on another CPU. The first tc program on a node and the
// last one to go flip the kernel's ingress/egress static keys: the kernel
// rewrites the code of __netif_receive_skb_core and __dev_queue_xmit while
// the other CPU runs it. Nothing may be lost and the kernel must survive.
//
// It also guards the VM runner's choice of single-threaded TCG: under
// multi-threaded TCG (QEMU 7.2) the guest died with "Oops: int3" in
// __netif_receive_skb_core or __dev_queue_xmit within a second of this
// load (hack/vm/README.md §10).
func TestAttachUnderTraffic(t *testing.T) {
	dptest.RequireRoot(t)
	const duration = 3 * time.Second

	// Traffic: an echo over a veth pair between two netns of its own.
	cli, srv := dptest.NewNetns(t, "atc"), dptest.NewNetns(t, "ats")
	c := dptest.NSConf(t, cli)
	c.Veth("a0", "", "b0", "", srv)
	c.Up("a0")
	c.Addr("a0", "10.250.7.1/24")
	s := dptest.NSConf(t, srv)
	s.Up("b0")
	s.Addr("b0", "10.250.7.2/24")
	var echo, client *net.UDPConn
	dptest.InNetns(t, srv, func() { echo = listenUDP(t, "10.250.7.2:7777") })
	dptest.InNetns(t, cli, func() { client = listenUDP(t, "10.250.7.1:0") })
	t.Cleanup(func() { echo.Close(); client.Close() })

	// The toggled node: its uplink program is taken off so that the pod
	// program is the node's only one and each attach flips the keys (unless
	// something outside this test holds them, as on a busy host).
	ns := attachNetns(t)
	pin := newPinDir(t)
	var d *Datapath
	dptest.InNetns(t, ns, func() {
		var err error
		if d, err = Load(Config{PinDir: pin, Uplink: "eth0", Logger: dptest.Logger(t)}); err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		err = d.detachLocked(roleUplink, "eth0")
		d.mu.Unlock()
		if err != nil {
			t.Fatalf("detach the uplink program: %v", err)
		}
	})
	t.Cleanup(func() {
		d.Close()
		if err := Uninstall(pin); err != nil {
			t.Errorf("Uninstall: %v", err)
		}
	})

	twoCPUs := runtime.NumCPU() >= 2
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var echoErr error
	wg.Go(func() { // the echo: CPU 0, like the client
		if twoCPUs {
			if echoErr = dptest.PinOneCPU(0); echoErr != nil {
				return
			}
		}
		buf := make([]byte, 64)
		for {
			n, from, err := echo.ReadFromUDP(buf)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					echoErr = err
				}
				return
			}
			if _, err := echo.WriteToUDP(buf[:n], from); err != nil {
				echoErr = err
				return
			}
		}
	})
	var trips, lost int
	var clientErr error
	clientDone := make(chan struct{})
	go func() { // the client: one datagram at a time, so no buffer can overflow
		defer close(clientDone)
		if twoCPUs {
			if clientErr = dptest.PinOneCPU(0); clientErr != nil {
				return
			}
		}
		dst := &net.UDPAddr{IP: net.IPv4(10, 250, 7, 2), Port: 7777}
		buf := make([]byte, 64)
		for seq := byte(0); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := client.WriteToUDP([]byte{seq}, dst); err != nil {
				clientErr = err
				return
			}
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := client.ReadFromUDP(buf)
			switch {
			case err != nil:
				lost++
			case n != 1 || buf[0] != seq:
				clientErr = errors.New("echo answered out of order")
				return
			default:
				trips++
			}
		}
	}()

	toggles := 0
	dptest.InNetns(t, ns, func() { // the toggler: CPU 1 while the traffic runs on CPU 0
		if twoCPUs {
			// dptest.PinOneCPU locks the thread once more than dptest.InNetns unlocks it:
			// the pinned thread ends with dptest.InNetns's goroutine
			if err := dptest.PinOneCPU(1); err != nil {
				t.Fatal(err)
			}
		}
		for end := time.Now().Add(duration); time.Now().Before(end); toggles++ {
			if err := d.AttachPod("lxc1"); err != nil {
				t.Fatalf("AttachPod #%d: %v", toggles+1, err)
			}
			if err := d.DetachPod("lxc1"); err != nil {
				t.Fatalf("DetachPod #%d: %v", toggles+1, err)
			}
		}
	})
	close(stop)
	<-clientDone // its last round trip finishes before the echo goes
	echo.Close()
	wg.Wait()

	t.Logf("%d attach/detach cycles, %d UDP round trips on the other CPU, %d lost (2 CPUs: %v)",
		toggles, trips, lost, twoCPUs)
	if clientErr != nil || echoErr != nil {
		t.Fatalf("traffic failed: client %v, echo %v", clientErr, echoErr)
	}
	if lost > 0 {
		t.Errorf("%d of %d UDP round trips lost while the pod program was attached and detached", lost, lost+trips)
	}
	if toggles < 5 || trips < 50 {
		t.Errorf("too little happened to mean anything: %d cycles, %d round trips in %v", toggles, trips, duration)
	}
}

func listenUDP(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	a, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", a)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
