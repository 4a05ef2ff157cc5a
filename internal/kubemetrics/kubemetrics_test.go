package kubemetrics

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// TestWorkqueueMetrics: a named queue made after Install reports its depth,
// adds and retries into every registry Register was given.
func TestWorkqueueMetrics(t *testing.T) {
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	for _, r := range []*prometheus.Registry{regA, regB} {
		if err := Register(r); err != nil {
			t.Fatal(err)
		}
	}
	// The hooks and their counters live as long as the process (-count=N
	// runs share them): a queue name of its own per run.
	name := "kubemetrics_test_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	defer q.ShutDown()
	q.Add("a")
	q.Add("b")
	steps := []struct {
		name string
		do   func()
		want string
	}{
		{"two waiting", func() {}, "workqueue_adds_total 2\nworkqueue_depth 2\n"},
		{"one taken", func() { it, _ := q.Get(); q.Done(it) }, "workqueue_adds_total 2\nworkqueue_depth 1\n"},
		{"a retry", func() { q.AddRateLimited("c") }, "workqueue_retries_total 1\n"},
	}
	for _, st := range steps {
		st.do()
		for i, r := range []*prometheus.Registry{regA, regB} {
			names := []string{"workqueue_adds_total", "workqueue_depth"}
			if strings.HasPrefix(st.want, "workqueue_retries") {
				names = []string{"workqueue_retries_total"}
			}
			got := gathered(t, r, name, names...)
			if got != st.want {
				t.Errorf("%s, registry %d:\n%s\nwant\n%s", st.name, i, got, st.want)
			}
		}
	}
}

func gathered(t *testing.T, r *prometheus.Registry, queue string, names ...string) string {
	t.Helper()
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, n := range names {
			if mf.GetName() == n {
				for _, m := range mf.Metric {
					for _, l := range m.Label {
						if l.GetName() == "name" && l.GetValue() == queue {
							v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
							b.WriteString(n + " " + strconv.FormatFloat(v, 'f', -1, 64) + "\n")
						}
					}
				}
			}
		}
	}
	return b.String()
}
