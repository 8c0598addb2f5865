package signaling

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of a server's counters. Rejected counts refusals and
// disconnects by error code (CodeTooLarge, CodeRateLimited, ...).
type Stats struct {
	Connections int64            // currently open WebSocket sessions
	Accepted    int64            // sessions accepted since start
	Authed      int64            // sessions that proved their ID
	Relayed     int64            // offer/answer/candidate/bye messages delivered
	Events      int64            // joined/left events queued for topic members
	Rejected    map[string]int64 // by code
	// Dropped counts sessions disconnected because they did not read what
	// the server had for them, by reason (Drop* constants). Each is also
	// counted in Rejected[CodeSlowConsumer].
	Dropped map[string]int64
	// QueuedBytes is what the send queues of all sessions hold now
	// (including the message each writer is writing); QueuedBytesPeak is
	// its highest value since start. Both stay under Config.MaxQueuedBytes
	// plus one message.
	QueuedBytes     int64
	QueuedBytesPeak int64
}

// Reasons a session is dropped as a slow consumer (Stats.Dropped, metric
// rdrr_signal_dropped_total{reason}).
const (
	DropQueueMessages = "queue_messages" // its queue held Config.SendQueue messages
	DropQueueBytes    = "queue_bytes"    // its queue held Config.SendQueueBytes
	DropGlobalBytes   = "global_bytes"   // all queues together reached Config.MaxQueuedBytes and its queue was the largest
	DropWriteTimeout  = "write_timeout"  // one write took longer than Config.WriteTimeout
)

var dropReasons = [...]string{DropQueueMessages, DropQueueBytes, DropGlobalBytes, DropWriteTimeout}

// counted are the codes the server counts; a fixed set, so counters need no
// lock.
var counted = [...]string{
	CodeBadMessage, CodeUnknownType, CodeVersion, CodeAuthFailed, CodeIDInUse,
	CodeTooLarge, CodeRateLimited, CodeTopicFull, CodeTooManyTopics,
	CodeServerFull, CodeAddrFull, CodeLoginsFull, CodeUnknownPeer,
	CodeIdleTimeout, CodeSlowConsumer, CodeTooManyErrors,
}

type counters struct {
	open, accepted, authed, relayed, events atomic.Int64
	queued, queuedPeak                      atomic.Int64                   // bytes in send queues
	rejected                                [len(counted)]atomic.Int64     // indexed like counted
	dropped                                 [len(dropReasons)]atomic.Int64 // indexed like dropReasons
}

func (c *counters) reject(code string) {
	for i, k := range counted {
		if k == code {
			c.rejected[i].Add(1)
			return
		}
	}
}

func (c *counters) drop(reason string) {
	for i, k := range dropReasons {
		if k == reason {
			c.dropped[i].Add(1)
			return
		}
	}
}

// addQueued adds n (negative: removes) to the queued bytes and returns the
// new total, keeping the peak.
func (c *counters) addQueued(n int64) int64 {
	v := c.queued.Add(n)
	for {
		p := c.queuedPeak.Load()
		if v <= p || c.queuedPeak.CompareAndSwap(p, v) {
			return v
		}
	}
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Connections:     c.open.Load(),
		Accepted:        c.accepted.Load(),
		Authed:          c.authed.Load(),
		Relayed:         c.relayed.Load(),
		Events:          c.events.Load(),
		Rejected:        make(map[string]int64, len(counted)),
		Dropped:         make(map[string]int64, len(dropReasons)),
		QueuedBytes:     c.queued.Load(),
		QueuedBytesPeak: c.queuedPeak.Load(),
	}
	for i, k := range counted {
		s.Rejected[k] = c.rejected[i].Load()
	}
	for i, k := range dropReasons {
		s.Dropped[k] = c.dropped[i].Load()
	}
	return s
}

var (
	descOpen     = prometheus.NewDesc("rdrr_signal_connections", "Open signaling WebSocket sessions.", nil, nil)
	descAccepted = prometheus.NewDesc("rdrr_signal_accepted_total", "Signaling sessions accepted.", nil, nil)
	descAuthed   = prometheus.NewDesc("rdrr_signal_authenticated_total", "Signaling sessions that proved their peer ID.", nil, nil)
	descRelayed  = prometheus.NewDesc("rdrr_signal_relayed_total", "Offer/answer/candidate/bye messages relayed.", nil, nil)
	descRejected = prometheus.NewDesc("rdrr_signal_rejected_total", "Messages or sessions refused, by error code.", []string{"code"}, nil)
	descEvents   = prometheus.NewDesc("rdrr_signal_events_total", "Joined/left events queued for topic members.", nil, nil)
	descDropped  = prometheus.NewDesc("rdrr_signal_dropped_total", "Sessions disconnected as slow consumers, by reason.", []string{"reason"}, nil)
	descQueued   = prometheus.NewDesc("rdrr_signal_queued_bytes", "Bytes held in the send queues of all sessions.", nil, nil)
	descPeak     = prometheus.NewDesc("rdrr_signal_queued_bytes_peak", "Highest rdrr_signal_queued_bytes since start.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descAccepted, descAuthed, descRelayed, descRejected, descEvents, descDropped, descQueued, descPeak} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	st := s.stats.snapshot()
	ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(st.Connections))
	ch <- prometheus.MustNewConstMetric(descAccepted, prometheus.CounterValue, float64(st.Accepted))
	ch <- prometheus.MustNewConstMetric(descAuthed, prometheus.CounterValue, float64(st.Authed))
	ch <- prometheus.MustNewConstMetric(descRelayed, prometheus.CounterValue, float64(st.Relayed))
	ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(st.Events))
	ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(st.QueuedBytes))
	ch <- prometheus.MustNewConstMetric(descPeak, prometheus.GaugeValue, float64(st.QueuedBytesPeak))
	for code, n := range st.Rejected {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(n), code)
	}
	for reason, n := range st.Dropped {
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(n), reason)
	}
}
