package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"k8s.io/klog/v2"

	"github.com/axonhq/axon/internal/cni"
)

// helperEnv carries a JSON Config: the test binary then runs the agent
// instead of the tests. The integration test starts it with
// `nsenter --net=<netns>` so that the whole process lives in the scratch
// namespace (an in-process agent would leak goroutines into the root netns).
const helperEnv = "AXON_AGENT_TEST_HELPER_CONFIG"

func TestMain(m *testing.M) {
	if os.Getenv(cniPluginEnv) == "1" {
		os.Exit(cni.Main())
	}
	if raw := os.Getenv(uninstallEnv); raw != "" {
		os.Exit(runUninstallHelper(raw))
	}
	if raw := os.Getenv(helperEnv); raw != "" {
		os.Exit(runHelper(raw))
	}
	os.Exit(m.Run())
}

func runHelper(raw string) int {
	var cfg Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "helper config:", err)
		return 2
	}
	log, _ := NewLogger("text", slog.LevelInfo, os.Stderr)
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, cfg, log); err != nil {
		log.Error("agent failed", "error", err)
		return 1
	}
	return 0
}
