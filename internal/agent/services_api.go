package agent

// The Service routes of the local API (`axon service list`,
// `axon bpf lb list`).

import (
	"cmp"
	"context"
	"net/http"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lb"
)

var _ api.ServicesHandler = (*Agent)(nil)

// writer returns the attached datapath writer, nil when watch only.
func (s *serviceSync) writer() lb.Writer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

// ServiceList implements api.ServicesHandler: the desired table (what the
// Service watch computed), whether or not it is programmed yet.
func (a *Agent) ServiceList(context.Context) (api.ServicesReply, error) {
	st, text := a.Services()
	var programmed map[string]api.ServiceVersions
	if a.svc != nil {
		programmed = a.svc.programmed()
	}
	return api.ServicesReply{
		Text:        text,
		Synced:      st.Synced,
		Writer:      st.Writer,
		Services:    st.Services,
		Frontends:   st.Frontends,
		Backends:    st.Backends,
		Problems:    st.Problems,
		WriteErrors: st.WriteErrors,
		Conflicts:   st.Conflicts,
		WatchError:  st.WatchError,
		NorthSouth:  st.NorthSouth,
		Programmed:  programmed,
	}, nil
}

// LBMaps implements api.ServicesHandler.
func (a *Agent) LBMaps(context.Context) (api.LBMapsReply, error) { return a.sock.lbMaps() }

// lbMaps is the reply of LBMaps: the frontends read back from the socket
// LB's BPF maps, i.e. what connect()/sendmsg() really translate.
func (s *socketLB) lbMaps() (api.LBMapsReply, error) {
	if !s.cfg.SocketLB {
		return api.LBMapsReply{Reason: "socket load balancing is off (--socket-lb=false)"}, nil
	}
	const pending = "not loaded yet: the socket LB loads after the tc datapath"
	lbErr, loaded := s.state()
	if loaded == "" {
		return api.LBMapsReply{Reason: cmp.Or(lbErr, pending)}, nil
	}
	w := s.mapsWriter()
	if w == nil {
		return api.LBMapsReply{Reason: pending}, nil
	}
	fs, err := w.Frontends()
	if err != nil {
		return api.LBMapsReply{}, api.Errorf(http.StatusInternalServerError, "read the socket LB maps: %v", err)
	}
	rep := api.LBMapsReply{Enabled: true, Frontends: len(fs), Text: lb.Render(fs)}
	for _, f := range fs {
		rep.Backends += len(f.Backends)
	}
	return rep, nil
}

// mapsWriter is the loaded socket LB: the Service watch's writer, or
// (without a Service watch) the feature's own handle, read under mu.
func (s *socketLB) mapsWriter() lb.Writer {
	if s.svc != nil {
		if w := s.svc.writer(); w != nil {
			return w
		}
	}
	return s.writer()
}
