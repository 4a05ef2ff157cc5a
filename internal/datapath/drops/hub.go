package drops

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Hub reads axon_drop_events for any number of subscribers. The ring
// buffer is read, and the programs write events, only while at least one
// subscriber is there: the first Subscribe sets axon_drop_listen to 1 and
// opens the reader, the last cancel sets it back to 0 and closes it.
type Hub struct {
	maps *Maps
	log  *slog.Logger

	mu     sync.Mutex
	subs   map[*Sub]struct{}
	rd     *ringbuf.Reader
	done   chan struct{}
	closed bool
}

// Sub is one subscriber: its events, and those it lost because it read too
// slowly (the kernel's losses, a full ring buffer, are in RingStats).
type Sub struct {
	C    <-chan Event
	c    chan Event
	mu   sync.Mutex
	lost uint64
}

// Lost is the number of events this subscriber missed (its queue was full).
func (s *Sub) Lost() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// NewHub returns a hub over maps; it sets the listener count to 0 (a
// listener count left by an agent that crashed while streaming).
func NewHub(maps *Maps, log *slog.Logger) (*Hub, error) {
	if err := maps.SetListeners(0); err != nil {
		return nil, err
	}
	return &Hub{maps: maps, log: log, subs: map[*Sub]struct{}{}}, nil
}

// Subscribe adds a subscriber with a queue of buf events; cancel removes it
// and closes its channel.
func (h *Hub) Subscribe(buf int) (*Sub, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, errors.New("drop event hub closed")
	}
	if len(h.subs) == 0 {
		rd, err := ringbuf.NewReader(h.maps.Events)
		if err != nil {
			return nil, nil, fmt.Errorf("open the drop event ring buffer: %w", err)
		}
		if err := h.maps.SetListeners(1); err != nil {
			rd.Close()
			return nil, nil, err
		}
		h.rd, h.done = rd, make(chan struct{})
		go h.run(rd, h.done)
	}
	c := make(chan Event, buf)
	s := &Sub{C: c, c: c}
	h.subs[s] = struct{}{}
	var once sync.Once
	return s, func() { once.Do(func() { h.unsubscribe(s) }) }, nil
}

func (h *Hub) unsubscribe(s *Sub) {
	h.mu.Lock()
	delete(h.subs, s)
	var rd *ringbuf.Reader
	var done chan struct{}
	if len(h.subs) == 0 && h.rd != nil {
		if err := h.maps.SetListeners(0); err != nil {
			h.log.Warn("drop events: listener count not reset: the programs go on writing events nobody reads", "err", err)
		}
		rd, done = h.rd, h.done
		h.rd, h.done = nil, nil
	}
	close(s.c)
	h.mu.Unlock()
	if rd != nil {
		rd.Close()
		<-done
	}
}

// Close stops the hub (the listener count back to 0).
func (h *Hub) Close() {
	h.mu.Lock()
	subs := make([]*Sub, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		h.unsubscribe(s)
	}
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

// bootWall is the wall time at CLOCK_MONOTONIC 0 (bpf_ktime_get_ns's clock).
func bootWall() time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano()))
}

func (h *Hub) run(rd *ringbuf.Reader, done chan struct{}) {
	defer close(done)
	base := bootWall()
	for {
		rec, err := rd.Read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				h.log.Warn("drop events: ring buffer read failed, events stop", "err", err)
			}
			return
		}
		ev, err := Decode(rec.RawSample, base)
		if err != nil {
			h.log.Warn("drop events: bad record", "err", err)
			continue
		}
		h.mu.Lock()
		for s := range h.subs {
			select {
			case s.c <- ev:
			default:
				s.mu.Lock()
				s.lost++
				s.mu.Unlock()
			}
		}
		h.mu.Unlock()
	}
}
