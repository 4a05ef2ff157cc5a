package agent

// Issue 4: the Service routes of the local API (`axon service list`,
// `axon bpf lb list`).

import (
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
	}, nil
}

// LBMaps implements api.ServicesHandler: the frontends read back from the
// socket LB's BPF maps, i.e. what connect()/sendmsg() really translate.
func (a *Agent) LBMaps(context.Context) (api.LBMapsReply, error) {
	if !a.cfg.SocketLB {
		return api.LBMapsReply{Reason: "socket load balancing is off (--socket-lb=false)"}, nil
	}
	a.stMu.Lock()
	lbErr, loaded := a.lbErr, a.lbCgroup
	a.stMu.Unlock()
	if loaded == "" {
		if lbErr == "" {
			lbErr = "not loaded yet: the socket LB loads after the tc datapath"
		}
		return api.LBMapsReply{Reason: lbErr}, nil
	}
	w := a.lbWriter()
	if w == nil {
		return api.LBMapsReply{Reason: "not loaded yet: the socket LB loads after the tc datapath"}, nil
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

// lbWriter is the loaded socket LB: the Service watch's writer, or (without
// a Service watch) the agent's own handle, read under dpMu.
func (a *Agent) lbWriter() lb.Writer {
	if a.svc != nil {
		if w := a.svc.writer(); w != nil {
			return w
		}
	}
	a.dpMu.Lock()
	defer a.dpMu.Unlock()
	if a.lb == nil {
		return nil
	}
	return a.lb
}
