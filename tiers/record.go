package tiers

import (
	"fmt"
	"maps"
	"sync"
)

// TraceRecorder records the accesses of a cache in the trace format, to be
// replayed by Simulate and Belady. Safe for concurrent use.
type TraceRecorder struct {
	mu    sync.Mutex
	trace Trace
	token int
}

// SetToken sets the token that the next accesses belong to (the pager
// calls it once per generated token).
func (r *TraceRecorder) SetToken(t int) {
	r.mu.Lock()
	r.token = t
	r.mu.Unlock()
}

func (r *TraceRecorder) key(id int, k Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.trace.Keys) <= id {
		r.trace.Keys = append(r.trace.Keys, TraceKey{Group: -1})
	}
	r.trace.Keys[id] = TraceKey{Size: k.Len, Label: fmt.Sprintf("%s:%d+%d", k.Blob, k.Off, k.Len), Group: r.trace.Keys[id].Group}
}

// group records key id's group (Cache.SetGroup).
func (r *TraceRecorder) group(id, group int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.trace.Keys) <= id {
		r.trace.Keys = append(r.trace.Keys, TraceKey{Group: -1})
	}
	r.trace.Keys[id].Group = group
}

// step records the token that the current step embeds (Cache.BeginStep).
func (r *TraceRecorder) step(token int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.trace.Tokens == nil {
		r.trace.Tokens = map[int]int{}
	}
	r.trace.Tokens[r.token] = token
}

// access records a demand of key id, or a prefetch of it to level to.
func (r *TraceRecorder) access(id int, prefetch bool, to Level) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := Access{Token: r.token, Key: id, Prefetch: prefetch}
	if prefetch {
		a.To = traceLevel(to)
	}
	r.trace.Accesses = append(r.trace.Accesses, a)
}

// Trace returns a copy of what was recorded.
func (r *TraceRecorder) Trace() *Trace {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &Trace{Keys: append([]TraceKey(nil), r.trace.Keys...), Accesses: append([]Access(nil), r.trace.Accesses...), Tokens: maps.Clone(r.trace.Tokens)}
}
