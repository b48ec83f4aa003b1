package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The records of etcd-lincheck's history format (lincheck/src/history.rs), fields in its order.

type opRecord struct {
	Kind     string `json:"kind"`
	ID       uint64 `json:"id"`
	Client   int    `json:"client"`
	Endpoint string `json:"endpoint"`
	Call     int64  `json:"call"`
	Return   *int64 `json:"return"`
	Op       any    `json:"op"`
	Result   any    `json:"result"`
}

type keyOp struct {
	Type string `json:"type"`
	Key  string `json:"key"`
}

type putOp struct {
	keyOp
	Value string `json:"value"`
}

type getOp struct {
	keyOp
	Serializable bool `json:"serializable"`
}

type casOp struct {
	keyOp
	Expect *string `json:"expect"` // null: the key is absent
	Value  string  `json:"value"`
}

type okResult struct {
	Status   string `json:"status"`
	Revision int64  `json:"revision"`
}

type okDelete struct {
	okResult
	Deleted int64 `json:"deleted"`
}

type okGet struct {
	okResult
	Value       *string `json:"value"` // null: absent
	ModRevision *int64  `json:"mod_revision"`
}

type okCas struct {
	okResult
	Succeeded bool `json:"succeeded"`
}

type errResult struct {
	Status string `json:"status"` // fail or unknown
	Error  string `json:"error"`
}

// classify tells what a failed request did: "fail" (definitely not applied) or "unknown" (maybe
// applied), in the spirit of tests/src/recorder/classify.rs and as conservatively: fail needs
// etcd's refusal before proposing, or a request that never reached a connection.
func classify(err error) string {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return "unknown"
	}
	var code codes.Code
	var message string
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		code, message = etcdErr.Code(), etcdErr.Error()
	} else if s, ok := status.FromError(err); ok {
		code, message = s.Code(), s.Message()
	} else {
		return "unknown"
	}
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated,
		codes.OutOfRange, codes.NotFound, codes.AlreadyExists, codes.Unimplemented:
		return "fail"
	case codes.ResourceExhausted:
		if strings.Contains(message, "database space exceeded") || strings.Contains(message, "too many requests") {
			return "fail"
		}
	case codes.Unavailable:
		// gRPC's picker found no connection (the dial failed): nothing was sent.
		if strings.Contains(message, "Error while dialing") || strings.Contains(message, "produced zero addresses") {
			return "fail"
		}
	}
	return "unknown"
}

type endpointChange struct {
	AtMs      float64  `json:"at_ms"`
	AtNs      int64    `json:"at_ns"`
	Endpoints []string `json:"endpoints"`
}

// report is the JSON summary written at exit.
type report struct {
	Ops        uint64 `json:"ops"`
	Ok         uint64 `json:"ok"`
	Failed     uint64 `json:"failed"`      // any error returned after clientv3's retries
	NotApplied uint64 `json:"not_applied"` // of which definitely not applied
	Unknown    uint64 `json:"unknown"`     // of which maybe applied (timeouts too)
	OkWrites   uint64 `json:"ok_writes"`
	// From the start to the stop of the traffic.
	DurationMs float64 `json:"duration_ms"`
	OpsPerSec  float64 `json:"ops_per_sec"`
	// The longest time between the calls of consecutive ok writes, counting from the start and
	// to the stop of the traffic.
	LongestWithoutWriteMs float64           `json:"longest_without_write_ms"`
	Errors                map[string]uint64 `json:"errors"`
	FirstErrorMs          *float64          `json:"first_error_ms"`
	LastErrorMs           *float64          `json:"last_error_ms"`
	FirstErrorAt          *string           `json:"first_error_at"`
	LastErrorAt           *string           `json:"last_error_at"`
	OkByEndpoint          map[string]uint64 `json:"ok_by_endpoint"`
	EndpointChanges       []endpointChange  `json:"endpoint_changes"`
	StartedAt             string            `json:"started_at"`
	Clients               int               `json:"clients"`
	Rate                  float64           `json:"rate"`
	Prefix                string            `json:"prefix"`
	History               *string           `json:"history"`
}

// recorder writes the history (a line per operation, as it happens) and keeps the figures.
type recorder struct {
	start   time.Time
	mu      sync.Mutex
	file    *os.File
	werr    error
	nextID  uint64
	r       report
	firstEr time.Time
	lastEr  time.Time
	writes  []int64           // the calls of ok writes
	addrs   map[string]string // host:port -> endpoint URL
	from    int64             // the traffic's start
	to      int64             // its stop
}

func newRecorder(path string) (*recorder, error) {
	rec := &recorder{
		start:  time.Now(),
		nextID: 1,
		addrs:  map[string]string{},
		r:      report{Errors: map[string]uint64{}, OkByEndpoint: map[string]uint64{}, EndpointChanges: []endpointChange{}},
	}
	rec.r.StartedAt = rec.start.UTC().Format(time.RFC3339Nano)
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("creating the history: %w", err)
		}
		rec.file = f
		rec.r.History = &path
	}
	return rec, nil
}

// now is the history's clock: nanoseconds since the start (monotonic).
func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) trafficStarted() { r.mu.Lock(); r.from = r.now(); r.mu.Unlock() }
func (r *recorder) trafficStopped() { r.mu.Lock(); r.to = r.now(); r.mu.Unlock() }

// endpointsApplied notes a new endpoint list; the log line is what tests/src/clientv3.rs awaits.
func (r *recorder) endpointsApplied(endpoints []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := r.now()
	for _, e := range endpoints {
		hostPort := e
		if i := strings.Index(e, "://"); i >= 0 {
			hostPort = e[i+3:]
		}
		r.addrs[strings.TrimSuffix(hostPort, "/")] = e
	}
	r.r.EndpointChanges = append(r.r.EndpointChanges, endpointChange{float64(at) / 1e6, at, slices.Clone(endpoints)})
	logger.Printf("endpoints applied at %d ns: %s", at, strings.Join(endpoints, ","))
}

// endpointOf is the endpoint URL of a peer address ("" when the request reached no connection).
func (r *recorder) endpointOf(addr string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.addrs[addr]; ok {
		return e
	}
	return addr
}

func (r *recorder) write(rec opRecord) {
	rec.Kind, rec.ID = "op", r.nextID
	r.nextID++
	r.r.Ops++
	if r.file == nil || r.werr != nil {
		return
	}
	line, err := json.Marshal(rec)
	if err == nil {
		_, err = r.file.Write(append(line, '\n'))
	}
	if err != nil {
		r.werr = fmt.Errorf("writing the history: %w", err)
		logger.Print(r.werr)
	}
}

func (r *recorder) ok(client int, endpoint string, call, ret int64, op, result any, write bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(opRecord{Client: client, Endpoint: endpoint, Call: call, Return: &ret, Op: op, Result: result})
	r.r.Ok++
	r.r.OkByEndpoint[endpoint]++
	if write {
		r.r.OkWrites++
		r.writes = append(r.writes, call)
	}
}

func (r *recorder) failed(client int, endpoint string, call, ret int64, op any, err error) {
	effect := classify(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	retp := &ret
	if effect == "unknown" {
		retp = nil
		r.r.Unknown++
	} else {
		r.r.NotApplied++
	}
	r.write(opRecord{Client: client, Endpoint: endpoint, Call: call, Return: retp, Op: op, Result: errResult{effect, err.Error()}})
	r.r.Failed++
	r.r.Errors[err.Error()]++
	now := time.Now()
	ms := float64(ret) / 1e6
	if r.r.FirstErrorMs == nil {
		r.r.FirstErrorMs, r.firstEr = &ms, now
	}
	r.r.LastErrorMs, r.lastEr = &ms, now
}

func (r *recorder) report(cfg config) report {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.r
	out.Clients, out.Rate, out.Prefix = cfg.clients, cfg.rate, cfg.prefix
	out.DurationMs = float64(r.to-r.from) / 1e6
	if out.DurationMs > 0 {
		out.OpsPerSec = float64(out.Ops) / (out.DurationMs / 1e3)
	}
	slices.Sort(r.writes)
	longest, from := int64(0), r.from
	for _, call := range append(r.writes, r.to) {
		longest = max(longest, call-from)
		from = max(from, call)
	}
	out.LongestWithoutWriteMs = float64(longest) / 1e6
	if out.FirstErrorMs != nil {
		first, last := r.firstEr.UTC().Format(time.RFC3339Nano), r.lastEr.UTC().Format(time.RFC3339Nano)
		out.FirstErrorAt, out.LastErrorAt = &first, &last
	}
	return out
}

// close closes the history; the error is the first write's or the close's.
func (r *recorder) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.file != nil {
		if err := r.file.Close(); err != nil && r.werr == nil {
			r.werr = fmt.Errorf("closing the history: %w", err)
		}
		r.file = nil
	}
	return r.werr
}

// writeReport writes the report whole (a reader never sees half of it).
func writeReport(path string, rep report) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return os.Rename(tmp, path)
}
