// Command clientv3-load sends a steady mix of requests to etcd through etcd's own Go client,
// go.etcd.io/etcd/client/v3 ("clientv3", as kube-apiserver and most etcd users do), with its
// default options: its retry interceptor, WaitForReady and round-robin balancing over the
// endpoints it is given. It shows what such a client sees while the operator acts on a cluster.
//
// Every operation is written to --history in etcd-lincheck's history format (JSON Lines, see
// lincheck/README.md); at exit a JSON summary goes to --report. The endpoint list can change
// while it runs: --endpoints-file is re-read every 500 ms and each client's SetEndpoints is
// called when it changes.
//
//	clientv3-load --endpoints http://127.0.0.1:2379,http://127.0.0.1:22379 --duration 30s \
//	  --history load.history.jsonl --report load.report.json
//
// It stops after --duration, or on SIGTERM or SIGINT: no new request is sent, those in flight
// get their answer (or their timeout), the report is written, and it exits 0. Exit 1: the run
// could not start (or its history could not be written); exit 2: bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// endpointsPoll is how often --endpoints-file is re-read.
const endpointsPoll = 500 * time.Millisecond

var logger = log.New(os.Stderr, "clientv3-load ", log.LstdFlags|log.Lmicroseconds)

type config struct {
	endpoints     []string
	endpointsFile string
	duration      time.Duration
	rate          float64
	clients       int
	prefix        string
	keys          int
	timeout       time.Duration
	history       string
	report        string
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "clientv3-load: %v\n", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		logger.Printf("error: %v", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("clientv3-load", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "comma-separated client URLs (or --endpoints-file)")
	fs.StringVar(&cfg.endpointsFile, "endpoints-file", "", "a file of client URLs (comma- or line-separated), re-read every 500 ms")
	fs.DurationVar(&cfg.duration, "duration", 0, "how long to run (0: until SIGTERM or SIGINT)")
	fs.Float64Var(&cfg.rate, "rate", 50, "operations per second over all clients")
	fs.IntVar(&cfg.clients, "clients", 2, "clients, each its own clientv3.Client sending one request at a time")
	fs.StringVar(&cfg.prefix, "prefix", "", "key prefix, empty at the start (default /clientv3-load/UNIXNANO/)")
	fs.IntVar(&cfg.keys, "keys", 10, "keys under the prefix")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "per-request timeout (a request timing out has an unknown outcome)")
	fs.StringVar(&cfg.history, "history", "", "write every operation here (etcd-lincheck history, JSON Lines)")
	fs.StringVar(&cfg.report, "report", "", "write the JSON summary here at exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.endpoints = splitEndpoints(*endpoints)
	switch {
	case len(cfg.endpoints) == 0 && cfg.endpointsFile == "":
		return cfg, errors.New("--endpoints or --endpoints-file is required")
	case len(cfg.endpoints) > 0 && cfg.endpointsFile != "":
		return cfg, errors.New("--endpoints and --endpoints-file exclude each other")
	case cfg.rate <= 0 || cfg.clients < 1 || cfg.keys < 1 || cfg.timeout <= 0 || cfg.duration < 0:
		return cfg, errors.New("--rate, --clients, --keys and --timeout must be positive, --duration not negative")
	}
	if cfg.prefix == "" {
		cfg.prefix = fmt.Sprintf("/clientv3-load/%d/", time.Now().UnixNano())
	}
	return cfg, nil
}

// splitEndpoints splits a list separated by commas or white space.
func splitEndpoints(text string) []string {
	return strings.FieldsFunc(text, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r'
	})
}

func readEndpoints(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	endpoints := splitEndpoints(string(data))
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%s lists no endpoint", path)
	}
	return endpoints, nil
}

// peerKey is the context key of the string where recordPeer writes a call's peer address.
type peerKey struct{}

// recordPeer notes the address each attempt went to (the last one wins). It is chained inside
// clientv3's own interceptor, so it sees every retry and changes nothing of the call.
func recordPeer(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if addr, ok := ctx.Value(peerKey{}).(*string); ok && p.Addr != nil {
		*addr = p.Addr.String()
	}
	return err
}

func run(cfg config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	endpoints := cfg.endpoints
	if cfg.endpointsFile != "" {
		var err error
		if endpoints, err = readEndpoints(cfg.endpointsFile); err != nil {
			return err
		}
	}
	rec, err := newRecorder(cfg.history)
	if err != nil {
		return err
	}
	defer rec.close()
	clients := make([]*clientv3.Client, 0, cfg.clients)
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for range cfg.clients {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   endpoints,
			DialTimeout: 5 * time.Second,
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(recordPeer)},
		})
		if err != nil {
			return fmt.Errorf("creating a client: %w", err)
		}
		clients = append(clients, c)
	}
	rec.endpointsApplied(endpoints)
	if err := checkEmpty(ctx, clients[0], cfg.prefix); err != nil && ctx.Err() == nil {
		return err // (stopped meanwhile: a clean stop with no operation)
	}
	var follower sync.WaitGroup
	if cfg.endpointsFile != "" {
		follower.Go(func() {
			followEndpointsFile(ctx, cfg.endpointsFile, endpoints, func(eps []string) {
				for _, c := range clients {
					c.SetEndpoints(eps...)
				}
				rec.endpointsApplied(eps)
			})
		})
	}
	keys := make([]string, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%sk%d", cfg.prefix, i)
	}
	interval := time.Duration(float64(time.Second) * float64(cfg.clients) / cfg.rate)
	logger.Printf("running: %d clients, %.1f ops/s, %d keys under %s, timeout %s", cfg.clients, cfg.rate, cfg.keys, cfg.prefix, cfg.timeout)
	rec.trafficStarted()
	var wg sync.WaitGroup
	for i, c := range clients {
		w := &worker{
			id:      i,
			kv:      clientv3.NewKV(c),
			rec:     rec,
			keys:    keys,
			rng:     rand.New(rand.NewPCG(0x5eed, uint64(i))),
			known:   map[string]*string{},
			timeout: cfg.timeout,
		}
		wg.Go(func() { w.run(ctx, interval) })
	}
	<-ctx.Done()
	rec.trafficStopped()
	logger.Printf("stopping: waiting for the requests in flight")
	wg.Wait()
	follower.Wait()
	report := rec.report(cfg)
	logger.Printf("done: %d ops, %d ok, %d failed (%d not applied, %d unknown), %.1f ops/s, longest without an ok write %.1f ms",
		report.Ops, report.Ok, report.Failed, report.NotApplied, report.Unknown, report.OpsPerSec, report.LongestWithoutWriteMs)
	if cfg.report != "" {
		if err := writeReport(cfg.report, report); err != nil {
			return err
		}
	}
	return rec.close()
}

// checkEmpty reads the prefix once (not recorded): etcd-lincheck takes every key as absent at
// the start of a history.
func checkEmpty(ctx context.Context, c *clientv3.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("reading the prefix %s: %w", prefix, err)
	}
	if resp.Count > 0 {
		return fmt.Errorf("the prefix %s holds %d keys: a history starts from an empty prefix", prefix, resp.Count)
	}
	return nil
}

// followEndpointsFile re-reads path every endpointsPoll and calls apply when the list changes
// (an unreadable or empty file keeps the current list).
func followEndpointsFile(ctx context.Context, path string, current []string, apply func([]string)) {
	t := time.NewTicker(endpointsPoll)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		endpoints, err := readEndpoints(path)
		if err != nil {
			if err.Error() != lastErr {
				logger.Printf("keeping the endpoints %s: %v", strings.Join(current, ","), err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		if !slices.Equal(endpoints, current) {
			apply(endpoints)
			current = endpoints
		}
	}
}

// Operation weights: puts of unique values, deletes, compare-and-swaps, linearizable gets.
var weights = []struct {
	kind   string
	weight int
}{{"put", 30}, {"delete", 10}, {"cas", 20}, {"get", 40}}

// worker is one client sending one request at a time.
type worker struct {
	id      int
	kv      clientv3.KV
	rec     *recorder
	keys    []string
	rng     *rand.Rand
	seq     int
	known   map[string]*string // the last value seen per key (nil: absent), for cas
	timeout time.Duration
}

func (w *worker) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval) // a slow answer drops ticks: one request at a time
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return
		}
		w.once()
	}
}

func (w *worker) choose() string {
	total := 0
	for _, k := range weights {
		total += k.weight
	}
	x := w.rng.IntN(total)
	for _, k := range weights {
		if x < k.weight {
			return k.kind
		}
		x -= k.weight
	}
	return "get"
}

// once sends one request and records it.
func (w *worker) once() {
	key := w.keys[w.rng.IntN(len(w.keys))]
	kind := w.choose()
	var op clientv3.Op
	var record any
	value := ""
	if kind == "put" || kind == "cas" {
		w.seq++
		value = fmt.Sprintf("c%d-%d", w.id, w.seq)
	}
	switch kind {
	case "put":
		op, record = clientv3.OpPut(key, value), putOp{keyOp{"put", key}, value}
	case "delete":
		op, record = clientv3.OpDelete(key), keyOp{"delete", key}
	case "cas":
		expect := w.known[key]
		cmp := clientv3.Compare(clientv3.Version(key), "=", 0)
		if expect != nil {
			cmp = clientv3.Compare(clientv3.Value(key), "=", *expect)
		}
		op = clientv3.OpTxn([]clientv3.Cmp{cmp}, []clientv3.Op{clientv3.OpPut(key, value)}, nil)
		record = casOp{keyOp{"cas", key}, expect, value}
	default:
		op, record = clientv3.OpGet(key), getOp{keyOp{"get", key}, false}
	}
	var addr string
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), peerKey{}, &addr), w.timeout)
	call := w.rec.now()
	resp, err := w.kv.Do(ctx, op)
	ret := w.rec.now()
	cancel()
	endpoint := w.rec.endpointOf(addr)
	if err != nil {
		delete(w.known, key)
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", w.timeout, err)
		}
		w.rec.failed(w.id, endpoint, call, ret, record, err)
		return
	}
	var result any
	ok := okResult{"ok", 0}
	switch kind {
	case "put":
		ok.Revision = resp.Put().Header.Revision
		result = ok
		w.known[key] = &value
	case "delete":
		ok.Revision = resp.Del().Header.Revision
		result = okDelete{ok, resp.Del().Deleted}
		w.known[key] = nil
	case "cas":
		txn := resp.Txn()
		ok.Revision = txn.Header.Revision
		result = okCas{ok, txn.Succeeded}
		if txn.Succeeded {
			w.known[key] = &value
		} else {
			delete(w.known, key)
		}
	default:
		get := resp.Get()
		ok.Revision = get.Header.Revision
		r := okGet{okResult: ok}
		if len(get.Kvs) > 0 {
			v, m := string(get.Kvs[0].Value), get.Kvs[0].ModRevision
			r.Value, r.ModRevision = &v, &m
		}
		result = r
		w.known[key] = r.Value
	}
	w.rec.ok(w.id, endpoint, call, ret, record, result, kind != "get")
}
