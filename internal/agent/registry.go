package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/atomicfile"
)

// registry persists endpoints as one JSON file each under <state>/endpoints,
// named <containerID>_<ifName>.json and written atomically.
type registry struct {
	dir string
	log *slog.Logger

	mu  sync.Mutex
	eps map[api.Attachment]api.Endpoint
}

func openRegistry(stateDir string, log *slog.Logger) (*registry, error) {
	dir := filepath.Join(stateDir, "endpoints")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create endpoint registry %s: %w", dir, err)
	}
	r := &registry{dir: dir, log: log, eps: map[api.Attachment]api.Endpoint{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read endpoint registry %s: %w", dir, err)
	}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue
		}
		var ep api.Endpoint
		err := atomicfile.ReadJSON(filepath.Join(dir, name), &ep)
		var pe *fs.PathError
		if errors.As(err, &pe) { // not read at all, unlike a record that does not parse
			return nil, fmt.Errorf("read endpoint %s: %w", name, err)
		}
		if err == nil {
			err = validateEndpoint(ep)
		}
		if err != nil {
			// Keep the file for inspection; it is not ours to delete.
			log.Warn("ignoring unreadable endpoint record; remove it once inspected", "file", filepath.Join(dir, name), "error", err)
			continue
		}
		r.eps[key(ep.ContainerID, ep.IfName)] = ep
	}
	return r, nil
}

func key(containerID, ifName string) api.Attachment {
	return api.Attachment{ContainerID: containerID, IfName: ifName}
}

func validateEndpoint(ep api.Endpoint) error {
	var errs []error
	if err := validateID("containerID", ep.ContainerID); err != nil {
		errs = append(errs, err)
	}
	if err := validateID("ifName", ep.IfName); err != nil {
		errs = append(errs, err)
	}
	if ep.HostIfName == "" {
		errs = append(errs, errors.New("hostIfName is empty: name the host-side device of the pod"))
	}
	if len(ep.PodMAC) != 6 {
		errs = append(errs, fmt.Errorf("podMAC %q is not a 6-byte ethernet address: send the MAC of the pod's interface", ep.PodMAC))
	}
	if len(ep.IPs) == 0 {
		errs = append(errs, errors.New("ips is empty: register the endpoint after IPAM allocate"))
	}
	for _, ip := range ep.IPs {
		if !ip.IsValid() {
			errs = append(errs, errors.New("ips contains an invalid address"))
		}
	}
	return errors.Join(errs...)
}

func validateID(field, v string) error {
	if v == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if strings.ContainsAny(v, "/\x00") || v == "." || v == ".." || len(v) > 255 {
		return fmt.Errorf("%s %q contains characters that cannot name a file", field, v)
	}
	return nil
}

func (r *registry) file(k api.Attachment) string {
	return filepath.Join(r.dir, k.ContainerID+"_"+k.IfName+".json")
}

// Put stores ep, replacing any previous record for the same key.
func (r *registry) Put(ep api.Endpoint) error {
	k := key(ep.ContainerID, ep.IfName)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := atomicfile.WriteJSON(r.file(k), ep, 0o600); err != nil {
		return fmt.Errorf("persist endpoint %s/%s: %w", ep.ContainerID, ep.IfName, err)
	}
	r.eps[k] = ep
	return nil
}

// Get returns the stored endpoint.
func (r *registry) Get(k api.Attachment) (api.Endpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ep, ok := r.eps[k]
	return ep, ok
}

// Delete removes the record; a missing one is not an error.
func (r *registry) Delete(k api.Attachment) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := os.Remove(r.file(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove endpoint record %s: %w", r.file(k), err)
	}
	delete(r.eps, k)
	return nil
}

// List returns all endpoints sorted by key.
func (r *registry) List() []api.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]api.Endpoint, 0, len(r.eps))
	for _, ep := range r.eps {
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b api.Endpoint) int {
		return strings.Compare(a.ContainerID+"/"+a.IfName, b.ContainerID+"/"+b.IfName)
	})
	return out
}
