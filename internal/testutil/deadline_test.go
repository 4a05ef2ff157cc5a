package testutil

import (
	"testing"
	"time"
)

func TestStretch(t *testing.T) {
	for _, tc := range []struct {
		env      string
		want     time.Duration
		wantFail bool
	}{
		{"", 30 * time.Second, false},
		{"1", 30 * time.Second, false},
		{"10", 300 * time.Second, false},
		{"0", 0, true},
		{"-2", 0, true},
		{"1.5", 0, true},
		{"ten", 0, true},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(slowdownEnv, tc.env)
			f := &fakeTB{}
			var got time.Duration
			done := make(chan struct{})
			go func() { // Stretch's failure ends this goroutine (FailNow)
				defer close(done)
				got = Stretch(f, 30*time.Second)
			}()
			<-done
			if f.failed != tc.wantFail {
				t.Fatalf("%s=%q: failed %v (%v), want %v", slowdownEnv, tc.env, f.failed, f.logs, tc.wantFail)
			}
			if !tc.wantFail && got != tc.want {
				t.Errorf("%s=%q: Stretch(30s) = %v, want %v", slowdownEnv, tc.env, got, tc.want)
			}
		})
	}
}
