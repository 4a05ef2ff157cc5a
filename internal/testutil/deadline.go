package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// slowdownEnv is the factor tests stretch their deadlines by: the VM runner
// (internal/vmtest) exports 10 under TCG and 1 with KVM; unset means 1.
const slowdownEnv = "AXON_TEST_SLOWDOWN"

// Stretch returns the deadline d multiplied by $AXON_TEST_SLOWDOWN, for
// bounds on work that runs slower in a VM. A value that is not a whole
// number of at least 1 fails the test: a typo must not silently shorten or
// drop the stretch.
func Stretch(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(slowdownEnv)
	if s == "" {
		return d
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a whole number >= 1", slowdownEnv, s)
	}
	return d * time.Duration(n)
}
