package signaling

import (
	"sync"
	"sync/atomic"
)

// sendQueue is one session's outbound queue: encoded messages waiting for
// the session's writer. It is bounded by messages and by bytes; the bytes
// of a message stay counted (here and in the server's total) until the
// writer has finished writing it, because that is when its memory can go.
type sendQueue struct {
	ready chan struct{} // cap 1: signalled when a message is pushed

	mu     sync.Mutex
	msgs   [][]byte
	closed bool

	queued  atomic.Int64 // bytes in msgs; read without mu to pick a victim
	writing atomic.Int64 // bytes popped and not yet written
}

func newSendQueue() *sendQueue {
	return &sendQueue{ready: make(chan struct{}, 1)}
}

// push appends b unless the queue is closed or full. The queue is full
// when it holds maxMsgs messages, or when it is not empty and b would take
// it past maxBytes (so one message larger than maxBytes still reaches an
// idle client). It returns "" on success, else the drop reason (or
// "closed").
func (q *sendQueue) push(b []byte, maxMsgs int, maxBytes int64) string {
	n := int64(len(b))
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return "closed"
	case len(q.msgs) >= maxMsgs:
		return DropQueueMessages
	case q.size() > 0 && q.size()+n > maxBytes:
		return DropQueueBytes
	}
	q.msgs = append(q.msgs, b)
	q.queued.Add(n)
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return ""
}

// pop takes the oldest message; its bytes stay counted until done(len(b)).
func (q *sendQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(q.msgs) == 0 {
		return nil, false
	}
	b := q.msgs[0]
	q.writing.Add(int64(len(b)))
	q.queued.Add(-int64(len(b)))
	q.msgs[0] = nil
	q.msgs = q.msgs[1:]
	if len(q.msgs) == 0 {
		q.msgs = nil // let append start a fresh array instead of creeping along the old one
	}
	return b, true
}

// done uncounts a popped message once it is written; it returns -n for the
// server's total.
func (q *sendQueue) done(n int) int64 {
	q.writing.Add(-int64(n))
	return -int64(n)
}

// size is what the queue holds, the message being written included.
func (q *sendQueue) size() int64 { return q.queued.Load() + q.writing.Load() }

// close refuses further pushes and discards what is queued. It returns the
// bytes it discarded (as a negative delta for the server's total); a
// message being written stays counted until done.
func (q *sendQueue) close() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0
	}
	q.closed = true
	var n int64
	for _, b := range q.msgs {
		n += int64(len(b))
	}
	q.msgs = nil
	q.queued.Add(-n)
	return -n
}
