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
	Rejected    map[string]int64 // by code
}

// counted are the codes the server counts; a fixed set, so counters need no
// lock.
var counted = [...]string{
	CodeBadMessage, CodeUnknownType, CodeVersion, CodeAuthFailed, CodeIDInUse,
	CodeTooLarge, CodeRateLimited, CodeTopicFull, CodeTooManyTopics,
	CodeServerFull, CodeUnknownPeer, CodeIdleTimeout, CodeSlowConsumer,
	CodeTooManyErrors,
}

type counters struct {
	open, accepted, authed, relayed atomic.Int64
	rejected                        [len(counted)]atomic.Int64 // indexed like counted
}

func (c *counters) reject(code string) {
	for i, k := range counted {
		if k == code {
			c.rejected[i].Add(1)
			return
		}
	}
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Connections: c.open.Load(),
		Accepted:    c.accepted.Load(),
		Authed:      c.authed.Load(),
		Relayed:     c.relayed.Load(),
		Rejected:    make(map[string]int64, len(counted)),
	}
	for i, k := range counted {
		s.Rejected[k] = c.rejected[i].Load()
	}
	return s
}

var (
	descOpen     = prometheus.NewDesc("rdrr_signal_connections", "Open signaling WebSocket sessions.", nil, nil)
	descAccepted = prometheus.NewDesc("rdrr_signal_accepted_total", "Signaling sessions accepted.", nil, nil)
	descAuthed   = prometheus.NewDesc("rdrr_signal_authenticated_total", "Signaling sessions that proved their peer ID.", nil, nil)
	descRelayed  = prometheus.NewDesc("rdrr_signal_relayed_total", "Offer/answer/candidate/bye messages relayed.", nil, nil)
	descRejected = prometheus.NewDesc("rdrr_signal_rejected_total", "Messages or sessions refused, by error code.", []string{"code"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descAccepted, descAuthed, descRelayed, descRejected} {
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
	for code, n := range st.Rejected {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(n), code)
	}
}
