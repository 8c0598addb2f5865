package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// GossipConfig configures Gossip. Zero values take the documented
// defaults.
type GossipConfig struct {
	// MaxMessageSize bounds one gossipsub RPC frame, whatever its topic
	// (default 256 KiB); each topic has its own, smaller bound too.
	MaxMessageSize int
	// SubscriptionBuffer is how many validated messages a topic holds for
	// its reader before gossipsub drops new ones (default 64).
	SubscriptionBuffer int
	// ValidateTimeout bounds one validator call (default 1 s).
	ValidateTimeout time.Duration
	// Registerer, if set, receives the gossip metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (c GossipConfig) withDefaults() GossipConfig {
	if c.MaxMessageSize <= 0 {
		c.MaxMessageSize = 256 << 10
	}
	if c.SubscriptionBuffer <= 0 {
		c.SubscriptionBuffer = 64
	}
	if c.ValidateTimeout <= 0 {
		c.ValidateTimeout = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Gossip is a gossipsub router on a Host. Every message is signed by its
// author (StrictSign: unsigned or badly signed messages are dropped by
// gossipsub before any validator) and validated per topic.
type Gossip struct {
	h      *Host
	ps     *pubsub.PubSub
	cfg    GossipConfig
	cancel context.CancelFunc
	msgs   *prometheus.CounterVec // topic, result

	mu     sync.Mutex
	closed bool
	topics map[string]*Topic
}

// Gossip message results, the label of rdrr_gossip_messages_total.
const (
	GossipAccepted = "accepted"  // passed the topic's validator
	GossipRejected = "rejected"  // the validator refused it: dropped, not forwarded
	GossipTooLarge = "too_large" // over the topic's size limit: dropped, not forwarded
)

// NewGossip starts gossipsub on h. Close it before h.
func NewGossip(h *Host, cfg GossipConfig) (*Gossip, error) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	ps, err := pubsub.NewGossipSub(ctx, h,
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithMaxMessageSize(cfg.MaxMessageSize),
		pubsub.WithLogger(cfg.Logger),
	)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("p2p: gossipsub: %w", err)
	}
	g := &Gossip{
		h: h, ps: ps, cfg: cfg, cancel: cancel,
		topics: make(map[string]*Topic),
		msgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rdrr_gossip_messages_total",
			Help: "Gossip messages received and validated, by topic and result (accepted, rejected, too_large).",
		}, []string{"topic", "result"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(g.msgs); err != nil {
			cancel()
			return nil, fmt.Errorf("p2p: gossip metrics: %w", err)
		}
	}
	return g, nil
}

// Counted returns how many messages of topic ended with result (one of
// GossipAccepted, GossipRejected, GossipTooLarge); own messages count
// too.
func (g *Gossip) Counted(topic, result string) int64 {
	var m dto.Metric
	if err := g.msgs.WithLabelValues(topic, result).Write(&m); err != nil {
		return 0
	}
	return int64(m.GetCounter().GetValue())
}

// Topic is a joined gossip topic whose messages passed its validator.
type Topic struct {
	g       *Gossip
	name    string
	maxSize int
	t       *pubsub.Topic
	sub     *pubsub.Subscription
}

// Message is one validated gossip message.
type Message struct {
	// From is the author, whose signature gossipsub verified (not the
	// peer that forwarded it).
	From peer.ID
	Data []byte
}

// JoinValidatedTopic joins name and subscribes to it. A message reaches
// Next, and is forwarded to others, only if it is at most maxSize bytes
// and validate(author, data) returns nil; other messages are dropped,
// not forwarded, and counted. validate must be safe for concurrent use,
// must not keep data, and should be quick (it is bounded by
// ValidateTimeout). Joining a topic twice is an error.
func (g *Gossip) JoinValidatedTopic(name string, maxSize int, validate func(from peer.ID, data []byte) error) (*Topic, error) {
	if maxSize <= 0 || maxSize > g.cfg.MaxMessageSize {
		return nil, fmt.Errorf("p2p: topic %q: size limit %d outside 1..%d", name, maxSize, g.cfg.MaxMessageSize)
	}
	if validate == nil {
		return nil, fmt.Errorf("p2p: topic %q: no validator", name)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrClosed
	}
	if g.topics[name] != nil {
		return nil, fmt.Errorf("p2p: topic %q already joined", name)
	}
	accepted := g.msgs.WithLabelValues(name, GossipAccepted)
	rejected := g.msgs.WithLabelValues(name, GossipRejected)
	tooLarge := g.msgs.WithLabelValues(name, GossipTooLarge)
	val := func(_ context.Context, _ peer.ID, m *pubsub.Message) pubsub.ValidationResult {
		if len(m.Data) > maxSize {
			tooLarge.Inc()
			return pubsub.ValidationReject
		}
		if err := validate(m.GetFrom(), m.Data); err != nil {
			rejected.Inc()
			g.cfg.Logger.Debug("p2p: gossip rejected", "topic", name, "from", m.GetFrom(), "via", m.ReceivedFrom, "err", err)
			return pubsub.ValidationReject
		}
		accepted.Inc()
		return pubsub.ValidationAccept
	}
	if err := g.ps.RegisterTopicValidator(name, val, pubsub.WithValidatorTimeout(g.cfg.ValidateTimeout)); err != nil {
		return nil, fmt.Errorf("p2p: topic %q: %w", name, err)
	}
	t, err := g.ps.Join(name)
	if err != nil {
		g.ps.UnregisterTopicValidator(name)
		return nil, fmt.Errorf("p2p: join %q: %w", name, err)
	}
	sub, err := t.Subscribe(pubsub.WithBufferSize(g.cfg.SubscriptionBuffer))
	if err != nil {
		t.Close()
		g.ps.UnregisterTopicValidator(name)
		return nil, fmt.Errorf("p2p: subscribe %q: %w", name, err)
	}
	tp := &Topic{g: g, name: name, maxSize: maxSize, t: t, sub: sub}
	g.topics[name] = tp
	return tp, nil
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// Publish signs data and sends it to the topic's peers. It is validated
// like any message first; an invalid one is an error and goes nowhere.
func (t *Topic) Publish(ctx context.Context, data []byte) error {
	if len(data) > t.maxSize {
		return fmt.Errorf("%w: %d bytes for topic %q (limit %d)", ErrTooLarge, len(data), t.name, t.maxSize)
	}
	if err := t.t.Publish(ctx, data); err != nil {
		return fmt.Errorf("p2p: publish to %q: %w", t.name, err)
	}
	return nil
}

// Next returns the next validated message from another peer (own
// messages are skipped), waiting until one arrives, ctx ends or the topic
// is closed. Not safe for concurrent use: a topic has one reader.
func (t *Topic) Next(ctx context.Context) (Message, error) {
	for {
		m, err := t.sub.Next(ctx)
		if err != nil {
			if errors.Is(err, pubsub.ErrSubscriptionCancelled) {
				return Message{}, ErrClosed
			}
			return Message{}, err
		}
		if m.GetFrom() == t.g.h.ID() {
			continue
		}
		return Message{From: m.GetFrom(), Data: m.Data}, nil
	}
}

// Peers returns the peers known to be subscribed to the topic.
func (t *Topic) Peers() []peer.ID { return t.t.ListPeers() }

// Close leaves the topic.
func (t *Topic) Close() error {
	t.g.mu.Lock()
	if t.g.topics[t.name] == t {
		delete(t.g.topics, t.name)
	}
	t.g.mu.Unlock()
	return t.close()
}

func (t *Topic) close() error {
	t.sub.Cancel()
	err := t.t.Close()
	t.g.ps.UnregisterTopicValidator(t.name)
	return err
}

// Close leaves every topic and stops gossipsub.
func (g *Gossip) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	topics := g.topics
	g.topics = nil
	g.mu.Unlock()
	for _, t := range topics {
		t.close()
	}
	g.cancel()
	return nil
}
