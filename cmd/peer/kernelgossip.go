package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/kernels"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/swarm/p2p"
	"github.com/spf13/cobra"
)

// kernelFlags are the daemon's kernel-lab flags.
type kernelFlags struct {
	gossip    bool
	pull      bool
	trust     string
	trustKeys string
	anyDriver bool
	announce  time.Duration
	class     string // hidden: act as a device of this exact class
	gpu       *gpu.Options
	timeout   time.Duration
	runs      int
}

func addKernelFlags(cmd *cobra.Command) *kernelFlags {
	kf := &kernelFlags{gpu: gpuFlags(cmd)}
	f := cmd.Flags()
	f.BoolVar(&kf.gossip, "kernel-gossip", true, "join this device class's endorsement topic (needs the p2p overlay and a GPU): store the valid endorsements that arrive, publish this peer's own")
	f.BoolVar(&kf.pull, "kernel-pull", false, "try endorsed variants as they arrive (gate and time each here in a child process, activate one only if it is faster here); --kernel-trust says whose endorsements count")
	f.StringVar(&kf.trust, "kernel-trust", "", "quorum=N: distinct endorsing peers needed before a variant is tried (default 2)")
	f.StringVar(&kf.trustKeys, "kernel-trust-keys", "", "file of trusted peer IDs: one endorsement from any is enough")
	f.BoolVar(&kf.anyDriver, "kernel-any-driver", false, "keep endorsements for this device with another driver")
	f.DurationVar(&kf.announce, "kernel-announce-interval", 10*time.Minute, "how often this peer republishes its own endorsements (also when a peer joins the topic)")
	f.DurationVar(&kf.timeout, "kernel-timeout", 10*time.Second, "time limit of one submission of a variant under test")
	f.IntVar(&kf.runs, "kernel-runs", 50, "timed batches of each variant when a pull times it")
	f.StringVar(&kf.class, "kernel-class", "", "act as a device of this exact class backend/vendor/device/driver (tests)")
	f.MarkHidden("kernel-class")
	return kf
}

// kernelDaemon is the daemon's part of the kernel lab: it keeps the
// endorsements of its device class that arrive by gossip, republishes
// its own, and with --kernel-pull tries what arrives.
type kernelDaemon struct {
	log    *slog.Logger
	class  kernels.DeviceClass
	self   peer.ID
	reg    *kernels.Registry
	recv   *kernels.Receiver
	topic  *p2p.Topic
	puller *kernels.Puller // nil: store only
	every  time.Duration

	pullq chan string // ops with new candidates
	mu    sync.Mutex
	pulls []kernelPull // latest last, at most maxPulls
	// judged: variants (and shapes) refused here by the gate or the
	// benchmark, and when: endorsements that keep coming for them (from
	// new identities, say) do not make the daemon gate them again for
	// judgedFor.
	judged map[string]time.Time
	sent   int // records published
	wg     sync.WaitGroup

	published prometheus.Counter
	tried     *prometheus.CounterVec
}

// kernelPull is what the daemon did with one candidate.
type kernelPull struct {
	At        time.Time `json:"at"`
	Op        string    `json:"op"`
	Variant   cas.CID   `json:"variant"`
	Shape     string    `json:"shape"`
	Endorsers int       `json:"endorsers"`
	Measured  float64   `json:"measuredSpeedup,omitempty"`
	Activated bool      `json:"activated"`
	Error     string    `json:"error,omitempty"`
}

// maxPulls bounds the pull results kept for the API.
const maxPulls = 64

// judgedFor is how long a refusal stands; maxJudged bounds the refusals
// remembered.
const (
	judgedFor = 24 * time.Hour
	maxJudged = 4096
)

func judgedKey(c kernels.Candidate) string { return c.Kernel.String() + " " + c.Shape }

// skip reports whether c was refused here within judgedFor.
func (k *kernelDaemon) skip(c kernels.Candidate) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.judged[judgedKey(c)]
	return ok && time.Since(at) < judgedFor
}

// judge remembers a refusal (k.mu held).
func (k *kernelDaemon) judgeLocked(c kernels.Candidate) {
	if len(k.judged) >= maxJudged {
		for key, at := range k.judged {
			if time.Since(at) >= judgedFor {
				delete(k.judged, key)
			}
		}
		if len(k.judged) >= maxJudged {
			clear(k.judged) // forget rather than grow: at worst a variant is gated again
		}
	}
	k.judged[judgedKey(c)] = time.Now()
}

// KernelStatus is /api/v1/kernels.
type KernelStatus struct {
	Class        string                `json:"class"`
	Topic        string                `json:"topic"`
	TopicPeers   int                   `json:"topicPeers"`
	Active       map[string]string     `json:"active"`
	Endorsements []kernels.Endorsement `json:"endorsements"`
	// Records are the stored records as signed (each a line of `peer
	// kernels import`): what the daemon serves of its endorsements.
	Records   []json.RawMessage     `json:"records"`
	Received  kernels.ReceiverStats `json:"received"`
	Published int                   `json:"published"`
	Pull      bool                  `json:"pull"`
	Pulls     []kernelPull          `json:"pulls"`
}

// startKernels joins the endorsement topic of this device's class, or
// returns nil (and logs why) when it cannot: no overlay, no GPU.
func (a *app) startKernels(ctx context.Context, kf *kernelFlags, ov *p2p.Overlay, st *cas.Store, fetch kernels.Fetcher, reg prometheus.Registerer) (*kernelDaemon, error) {
	if kf == nil || !kf.gossip || ov == nil || ov.Gossip == nil {
		return nil, nil
	}
	if err := a.gpuEnv(); err != nil {
		return nil, err
	}
	lf := &labFlags{gpu: kf.gpu, timeout: kf.timeout, runs: kf.runs}
	w, err := a.isolated(lf)
	if err != nil {
		return nil, err
	}
	var class kernels.DeviceClass
	if kf.class != "" {
		if class, err = parseClass(kf.class); err != nil {
			return nil, err
		}
	} else {
		ictx, cancel := context.WithTimeout(ctx, time.Minute)
		class, _, err = w.Info(ictx)
		cancel()
		if err != nil {
			a.log.Warn("kernel gossip off: no GPU adapter here", "err", err)
			return nil, nil
		}
	}
	var pol kernels.Policy
	if kf.pull {
		if pol, err = parseTrust(kf.trust, kf.trustKeys, kf.anyDriver); err != nil {
			return nil, err
		}
	}
	kreg, err := kernels.OpenRegistry(filepath.Join(a.home, "kernels"), nil)
	if err != nil {
		return nil, err
	}
	self := ov.Host.ID() // the swarm identity's key
	coarse := class.Coarse()
	topic, err := ov.Gossip.JoinValidatedTopic(kernels.Topic(coarse), kernels.MaxEndorsementBytes,
		func(_ peer.ID, data []byte) error { return kernels.Relayable(data, coarse, time.Now()) })
	if err != nil {
		kreg.Close()
		return nil, err
	}
	k := &kernelDaemon{
		log: a.log, class: class, self: self, reg: kreg, topic: topic, every: kf.announce,
		recv:  &kernels.Receiver{V: &kernels.Verifier{Class: class, AnyDriver: kf.anyDriver, ABI: kernels.ABIVersions()}, Registry: kreg},
		pullq: make(chan string, len(kernels.Ops())), judged: map[string]time.Time{},
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdrr_kernel_endorsements_published_total",
			Help: "Endorsement records this peer published on its class's topic (its own, republished)."}),
		tried: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdrr_kernel_pulls_total",
			Help: "Endorsed variants tried here, by result (activated, refused)."}, []string{"result"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{k.published, k.tried} {
			if err := reg.Register(c); err != nil {
				a.log.Warn("kernel metrics not registered", "err", err)
			}
		}
	}
	if kf.pull {
		bs, err := kernels.RegisterBuiltins(ctx, st)
		if err != nil {
			topic.Close()
			kreg.Close()
			return nil, err
		}
		k.puller = &kernels.Puller{Registry: kreg, Store: st, Fetcher: fetch, Gate: w, Bench: w, Policy: pol, Class: class,
			Baselines: bs, Log: a.log, Skip: k.skip}
		// What arrived while the daemon was down is worth a try too.
		for _, op := range kernels.Ops() {
			k.pullq <- op
		}
	}
	k.wg.Add(3)
	go k.read(ctx)
	go k.republish(ctx)
	go k.pullLoop(ctx)
	a.log.Info("kernel gossip", "class", class.Exact(), "topic", topic.Name(), "pull", kf.pull)
	return k, nil
}

// parseClass reads "backend/vendor/device/driver".
func parseClass(s string) (kernels.DeviceClass, error) {
	p := strings.Split(s, "/")
	if len(p) != 4 || p[0] == "" || p[1] == "" || p[2] == "" {
		return kernels.DeviceClass{}, fmt.Errorf("--kernel-class %q: want backend/vendor/device/driver", s)
	}
	return kernels.DeviceClass{Backend: p[0], Vendor: p[1], Device: p[2], Driver: p[3]}, nil
}

// read stores what arrives valid and queues a pull of its op.
func (k *kernelDaemon) read(ctx context.Context) {
	defer k.wg.Done()
	for {
		m, err := k.topic.Next(ctx)
		if err != nil {
			return
		}
		before := k.recv.Stats().Accepted
		k.recv.Handle(m.From, m.Data)
		if k.recv.Stats().Accepted == before {
			continue
		}
		s, err := kernels.Decode(m.Data)
		if err != nil {
			continue
		}
		k.log.Info("kernel endorsement received", "op", s.Endorsement.Op, "variant", s.Endorsement.Kernel,
			"speedup", s.Endorsement.Speedup, "author", s.Endorsement.Peer, "via", m.From)
		if err := k.reg.Flush(); err != nil {
			k.log.Warn("kernel registry not written", "err", err)
		}
		if k.puller != nil {
			select {
			case k.pullq <- s.Endorsement.Op:
			default: // a pull of every op is queued already
			}
		}
	}
}

// republish sends this peer's own endorsements every interval, and soon
// after a peer it had not seen joins the topic (gossip keeps nothing:
// a peer that joins later hears only what is sent after).
func (k *kernelDaemon) republish(ctx context.Context) {
	defer k.wg.Done()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	seen := map[peer.ID]bool{}
	last := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		joined := false
		for _, p := range k.topic.Peers() {
			if !seen[p] {
				seen[p], joined = true, true
			}
		}
		if len(seen) > 4096 { // forget, rather than grow without bound
			clear(seen)
		}
		if !joined && time.Since(last) < k.every {
			continue
		}
		last = time.Now()
		for _, rec := range k.reg.RecordsBy(k.self) {
			if err := k.topic.Publish(ctx, rec); err != nil {
				k.log.Warn("kernel endorsement not published", "err", err)
				break
			}
			k.published.Inc()
			k.mu.Lock()
			k.sent++
			k.mu.Unlock()
		}
	}
}

// pullLoop tries the candidates of each queued op, one op at a time.
func (k *kernelDaemon) pullLoop(ctx context.Context) {
	defer k.wg.Done()
	if k.puller == nil {
		return
	}
	for {
		var op string
		select {
		case <-ctx.Done():
			return
		case op = <-k.pullq:
		}
		res, err := k.puller.Pull(ctx, op)
		if err != nil {
			if ctx.Err() == nil {
				k.log.Warn("kernel pull", "op", op, "err", err)
			}
			continue
		}
		k.mu.Lock()
		for _, r := range res {
			p := kernelPull{At: time.Now(), Op: op, Variant: r.Candidate.Kernel, Shape: r.Candidate.Shape,
				Endorsers: len(r.Candidate.Endorsers), Measured: r.Speedup.Median, Activated: r.Activated}
			result := "refused"
			if r.Err != nil {
				p.Error = r.Err.Error()
			}
			if r.Activated {
				result = "activated"
			} else if kernels.Judged(r.Err) {
				k.judgeLocked(r.Candidate)
			}
			k.tried.WithLabelValues(result).Inc()
			k.pulls = append(k.pulls, p)
		}
		if n := len(k.pulls) - maxPulls; n > 0 {
			k.pulls = append(k.pulls[:0], k.pulls[n:]...)
		}
		k.mu.Unlock()
	}
}

// Status is the daemon's kernel state for the API.
func (k *kernelDaemon) Status() KernelStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	return KernelStatus{Class: k.class.Exact(), Topic: k.topic.Name(), TopicPeers: len(k.topic.Peers()),
		Active: k.reg.ActiveAll(), Endorsements: k.reg.Endorsements(), Records: records(k.reg), Received: k.recv.Stats(),
		Published: k.sent, Pull: k.puller != nil, Pulls: append([]kernelPull{}, k.pulls...)}
}

func records(r *kernels.Registry) []json.RawMessage {
	var out []json.RawMessage
	for _, b := range r.Records() {
		out = append(out, b)
	}
	return out
}

// Close leaves the topic once the loops (whose context ended) are done,
// and writes the registry.
func (k *kernelDaemon) Close() error {
	err := k.topic.Close()
	k.wg.Wait()
	return errors.Join(err, k.reg.Close())
}

// swarmFetcher brings a variant's blobs into the store from the swarm.
type swarmFetcher struct {
	m  *swarm.Member
	st *cas.Store
}

func (f swarmFetcher) Fetch(ctx context.Context, c cas.CID, maxSize int64) error {
	if info, err := f.st.Stat(c); err == nil && !info.Corrupt {
		if info.Size > maxSize {
			return fmt.Errorf("%s holds %d bytes (limit %d)", c, info.Size, maxSize)
		}
		return nil
	}
	n, err := awaitNode(ctx, f.m.Node)
	if err != nil {
		return err
	}
	_, err = n.Fetch(ctx, f.st, c, swarm.FetchOptions{Discover: f.m.Discover, Providers: f.m.Providers, MaxBlobSize: maxSize})
	return err
}

// kernelsStatusCmd is `peer kernels status`: the kernel state of the
// daemon running on this home (its store is the daemon's while it runs).
func kernelsStatusCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "The kernel gossip of the daemon running on this home: class, active variants, endorsements received, pulls",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st KernelStatus
			if err := a.apiGet("/api/v1/kernels", &st); err != nil {
				return err
			}
			return a.print(st, func(w io.Writer) {
				fmt.Fprintf(w, "class %s, topic %s with %d peers\n", st.Class, st.Topic, st.TopicPeers)
				ops := make([]string, 0, len(st.Active))
				for op, v := range st.Active {
					if v != kernels.Builtin {
						ops = append(ops, op)
					}
				}
				sort.Strings(ops)
				for _, op := range ops {
					fmt.Fprintf(w, "active %s: %s\n", op, st.Active[op])
				}
				fmt.Fprintf(w, "endorsements stored %d; received: %d accepted, %d duplicate, dropped %v; published %d of this peer's\n",
					len(st.Endorsements), st.Received.Accepted, st.Received.Duplicate, st.Received.Dropped, st.Published)
				if !st.Pull {
					fmt.Fprintln(w, "pulls off (peer daemon --kernel-pull)")
				}
				for _, p := range st.Pulls {
					why := ""
					if p.Error != "" {
						why = ": " + p.Error
					}
					fmt.Fprintf(w, "pulled %s %s (%s, %d endorsers): measured %.2fx here, activated %v%s\n",
						p.Op, p.Variant, p.Shape, p.Endorsers, p.Measured, p.Activated, why)
				}
			})
		},
	}
}
