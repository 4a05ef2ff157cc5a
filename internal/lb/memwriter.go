package lb

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemWriter is an in-memory Writer: what the agent runs against when no BPF
// datapath is loaded in tests, and what the control-plane tests read back.
// It records every operation with its time. Safe for concurrent use.
type MemWriter struct {
	mu      sync.Mutex
	fs      map[FrontendKey]Frontend
	ops     []Op
	failN   int           // fail this many next writes
	notify  chan struct{} // closed and replaced on every write
	maxSize int
	entries int // SetCapacity: max of sum(1 + backends) over frontends; 0 = no limit
	used    int // sum(1 + backends) over fs
}

// SetCapacity bounds the writer like a BPF service map: each frontend takes
// one entry plus one per backend; 0 = no limit. Fits and writes honour it.
func (m *MemWriter) SetCapacity(entries int) {
	m.mu.Lock()
	m.entries = entries
	m.mu.Unlock()
}

func (m *MemWriter) usedLocked() int { return m.used }

// Fits implements CapacityChecker.
func (m *MemWriter) Fits(fs []Frontend) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries <= 0 {
		return nil
	}
	need := 0
	for _, f := range fs {
		need += 1 + len(f.Backends)
		if old, ok := m.fs[f.Key]; ok {
			need -= 1 + len(old.Backends)
		}
	}
	if free := m.entries - m.usedLocked(); need > free {
		return fmt.Errorf("%w: needs %d more entries, %d of %d free", ErrFull, need, max(free, 0), m.entries)
	}
	return nil
}

// Op is one write seen by a MemWriter.
type Op struct {
	At       time.Time
	Delete   bool
	Key      FrontendKey
	Frontend Frontend // for upserts
}

// ErrMemFull is returned by a MemWriter with a size limit that is full.
var ErrMemFull = errors.New("frontend table full")

// NewMemWriter returns an empty writer; maxFrontends 0 = no limit.
func NewMemWriter(maxFrontends int) *MemWriter {
	return &MemWriter{fs: map[FrontendKey]Frontend{}, notify: make(chan struct{}), maxSize: maxFrontends}
}

// FailNext makes the next n writes fail (to test retries).
func (m *MemWriter) FailNext(n int) {
	m.mu.Lock()
	m.failN = n
	m.mu.Unlock()
}

func (m *MemWriter) write(op Op) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failN > 0 {
		m.failN--
		return fmt.Errorf("write %s: injected failure", op.Key)
	}
	if op.Delete {
		if old, ok := m.fs[op.Key]; ok {
			m.used -= 1 + len(old.Backends)
		}
		delete(m.fs, op.Key)
	} else {
		old, ok := m.fs[op.Key]
		if !ok && m.maxSize > 0 && len(m.fs) >= m.maxSize {
			return fmt.Errorf("write %s: %w (%d entries)", op.Key, ErrMemFull, m.maxSize)
		}
		if m.entries > 0 {
			grow := 1 + len(op.Frontend.Backends)
			if ok {
				grow -= 1 + len(old.Backends)
			}
			if m.usedLocked()+grow > m.entries {
				return fmt.Errorf("write %s: %w (%d entries)", op.Key, ErrFull, m.entries)
			}
		}
		op.Frontend.Backends = slices.Clone(op.Frontend.Backends)
		if ok {
			m.used -= 1 + len(old.Backends)
		}
		m.used += 1 + len(op.Frontend.Backends)
		m.fs[op.Key] = op.Frontend
	}
	op.At = time.Now()
	m.ops = append(m.ops, op)
	close(m.notify)
	m.notify = make(chan struct{})
	return nil
}

// UpsertFrontend implements Writer.
func (m *MemWriter) UpsertFrontend(f Frontend) error {
	return m.write(Op{Key: f.Key, Frontend: f})
}

// DeleteFrontend implements Writer.
func (m *MemWriter) DeleteFrontend(k FrontendKey) error { return m.write(Op{Delete: true, Key: k}) }

// Frontends implements Writer.
func (m *MemWriter) Frontends() ([]Frontend, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Frontend, 0, len(m.fs))
	for _, f := range m.fs {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	return out, nil
}

// Render is Render of the current content.
func (m *MemWriter) Render() string {
	fs, _ := m.Frontends()
	return Render(fs)
}

// Ops returns the writes from index i on, and the index to continue from.
func (m *MemWriter) Ops(i int) ([]Op, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i = min(max(i, 0), len(m.ops))
	return slices.Clone(m.ops[i:]), len(m.ops)
}

// Changed returns a channel closed at the next write.
func (m *MemWriter) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.notify
}

var (
	_ Writer          = (*MemWriter)(nil)
	_ CapacityChecker = (*MemWriter)(nil)
)
