package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/kernels"
)

// Isolated runs the gate and the benchmark in a child process, one child
// per call, each with a fresh device: a kernel that hangs the device, loses
// it or crashes the driver takes the child down, never the caller, and the
// next call starts clean. It implements kernels.Gate and kernels.Bench.
// Safe for concurrent use (each call has its own child); its fields are
// not changed after the first call.
//
// The child is whatever Command starts: a process that calls ServeWorker
// on its standard input and output and exits (`peer kernels worker`; a test
// binary re-executing itself).
type Isolated struct {
	// Command returns the worker command, not yet started. Isolated sets
	// its standard input, output and error.
	Command func() *exec.Cmd
	// GPU picks the adapter in the child (Backend and Adapter only).
	GPU gpu.Options
	// Timeout bounds a whole call (start-up, compile, runs): past it the
	// child is killed and the variant rejected with ErrTimeLimit. 0 means
	// 2 minutes for Check and 5 for Compare.
	Timeout time.Duration
	// DispatchTimeout bounds each submission in the child (Lab.Timeout).
	DispatchTimeout time.Duration
	// Budget bounds the timed part of a Compare (Lab.Budget).
	Budget time.Duration
	Log    *slog.Logger // nil: discard
}

// Limits of the worker protocol.
const (
	maxRequestBytes  = 4 << 20
	maxResponseBytes = 1 << 20
	stderrTail       = 4 << 10
)

// request is what the parent sends the child: one JSON object.
type request struct {
	Kind            string        `json:"kind"` // "info", "check" or "compare"
	Backend         gpu.Backend   `json:"backend"`
	Adapter         string        `json:"adapter,omitempty"`
	Candidate       *wireArtifact `json:"candidate,omitempty"`
	Baseline        *wireArtifact `json:"baseline,omitempty"`
	Dims            []int         `json:"dims,omitempty"`
	Seed            uint64        `json:"seed"`
	Warmup          int           `json:"warmup,omitempty"`
	Runs            int           `json:"runs,omitempty"`
	DispatchTimeout time.Duration `json:"dispatchTimeout,omitempty"`
	Budget          time.Duration `json:"budget,omitempty"`
}

type wireArtifact struct {
	Descriptor []byte `json:"descriptor"`
	WGSL       []byte `json:"wgsl"`
}

// response is the child's answer: one JSON object.
type response struct {
	Class   kernels.DeviceClass  `json:"class"`
	Adapter gpu.AdapterInfo      `json:"adapter"`
	Report  *kernels.GateReport  `json:"report,omitempty"`
	Result  *kernels.BenchResult `json:"result,omitempty"`
	Error   string               `json:"error,omitempty"`
	// ErrKind says which sentinel Error wraps: "gate", "time" (the
	// time limit, also a gate refusal) or "" (another failure).
	ErrKind string `json:"errKind,omitempty"`
}

func toWire(a *kernels.Artifact) *wireArtifact {
	return &wireArtifact{Descriptor: a.Descriptor.Encode(), WGSL: a.WGSL}
}

// fromWire rebuilds an artifact and checks it is the one named want
// (when want is not zero).
func fromWire(w *wireArtifact) (*kernels.Artifact, error) {
	if w == nil {
		return nil, fmt.Errorf("lab: missing artifact")
	}
	d, err := kernels.DecodeDescriptor(w.Descriptor)
	if err != nil {
		return nil, err
	}
	a, err := kernels.NewArtifact(*d, w.WGSL)
	if err != nil {
		return nil, err
	}
	if a.Descriptor.WGSL != d.WGSL {
		return nil, fmt.Errorf("%w: wgsl does not match the descriptor", kernels.ErrDescriptor)
	}
	return a, nil
}

// decodeResponse parses a child's answer strictly: bounded, one object,
// no unknown fields, no trailing data.
func decodeResponse(b []byte) (*response, error) {
	if len(b) > maxResponseBytes {
		return nil, fmt.Errorf("lab: worker answered %d bytes (limit %d)", len(b), maxResponseBytes)
	}
	var r response
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("lab: worker answer: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("lab: worker answer: trailing data")
	}
	if r.Result != nil && (len(r.Result.CandidateNs) > kernels.MaxRuns || len(r.Result.BaselineNs) > kernels.MaxRuns) {
		return nil, fmt.Errorf("lab: worker answer: %d runs", len(r.Result.CandidateNs))
	}
	return &r, nil
}

// err turns the answer's error back into one that wraps its sentinel.
func (r *response) err() error {
	switch {
	case r.Error == "":
		return nil
	case r.ErrKind == "time":
		return fmt.Errorf("%w: %w: %s", kernels.ErrGate, ErrTimeLimit, r.Error)
	case r.ErrKind == "gate":
		return fmt.Errorf("%w: %s", kernels.ErrGate, r.Error)
	}
	return errors.New(r.Error)
}

// limitedBuffer keeps the first limit bytes written and counts the rest.
type limitedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
	over  int
	tail  bool // keep the last limit bytes instead
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if extra := b.buf.Len() - b.limit; extra > 0 {
		b.over += extra
		if b.tail {
			b.buf.Next(extra)
		} else {
			b.buf.Truncate(b.limit)
		}
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.buf.Bytes())
}

// call runs one request in a fresh child under timeout.
func (w *Isolated) call(ctx context.Context, req request, timeout time.Duration) (*response, error) {
	if w.Command == nil {
		return nil, fmt.Errorf("lab: no worker command")
	}
	if w.Timeout > 0 {
		timeout = w.Timeout
	}
	req.Backend, req.Adapter = w.GPU.Backend, w.GPU.Adapter
	req.DispatchTimeout, req.Budget = w.DispatchTimeout, w.Budget
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	cmd := w.Command()
	cmd.Stdin = bytes.NewReader(body)
	stdout := &limitedBuffer{limit: maxResponseBytes + 1}
	stderr := &limitedBuffer{limit: stderrTail, tail: true}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lab: start worker: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var werr error
	timedOut := false
	select {
	case werr = <-done:
	case <-timer.C:
		timedOut = true
		cmd.Process.Kill()
		werr = <-done
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return nil, ctx.Err()
	}
	log := w.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Debug("lab worker", "kind", req.Kind, "seconds", time.Since(start).Seconds(), "err", werr, "timed_out", timedOut)
	if timedOut {
		return nil, fmt.Errorf("%w: %w: the worker ran past %v and was killed", kernels.ErrGate, ErrTimeLimit, timeout)
	}
	out := stdout.Bytes()
	if len(out) == 0 {
		// No answer: the child died (a driver crash, the device lost
		// beyond recovery). With a variant on board, it is the variant's.
		msg := fmt.Sprintf("the worker died without an answer (%v): %s", werr, bytes.TrimSpace(stderr.Bytes()))
		if req.Candidate != nil {
			return nil, fmt.Errorf("%w: %s", kernels.ErrGate, msg)
		}
		return nil, errors.New("lab: " + msg)
	}
	r, err := decodeResponse(out)
	if err != nil {
		return nil, err
	}
	return r, r.err()
}

// Info returns the class and adapter of the device a child opens.
func (w *Isolated) Info(ctx context.Context) (kernels.DeviceClass, gpu.AdapterInfo, error) {
	r, err := w.call(ctx, request{Kind: "info"}, time.Minute)
	if err != nil {
		return kernels.DeviceClass{}, gpu.AdapterInfo{}, err
	}
	return r.Class, r.Adapter, nil
}

// Check runs the gate in a child (kernels.Gate).
func (w *Isolated) Check(ctx context.Context, v *kernels.Artifact, seed uint64) (kernels.GateReport, error) {
	r, err := w.call(ctx, request{Kind: "check", Candidate: toWire(v), Seed: seed}, 2*time.Minute)
	if r != nil && r.Report != nil {
		return *r.Report, err
	}
	return kernels.GateReport{Seed: seed}, err
}

// Compare runs the benchmark in a child (kernels.Bench).
func (w *Isolated) Compare(ctx context.Context, cand, base *kernels.Artifact, dims []int, opt kernels.BenchOptions) (kernels.BenchResult, error) {
	req := request{Kind: "compare", Candidate: toWire(cand), Baseline: toWire(base), Dims: dims, Seed: opt.Seed,
		Warmup: opt.Warmup, Runs: opt.Runs}
	r, err := w.call(ctx, req, 5*time.Minute)
	if err != nil {
		return kernels.BenchResult{}, err
	}
	if r.Result == nil {
		return kernels.BenchResult{}, fmt.Errorf("lab: worker answered no result")
	}
	if r.Result.Op != cand.Descriptor.Op || !slices.Equal(r.Result.Dims, dims) || r.Result.Seed != opt.Seed {
		return kernels.BenchResult{}, fmt.Errorf("lab: worker answered for another comparison")
	}
	return *r.Result, nil
}

// ServeWorker is the child's side: it reads one request from in, opens a
// device, runs the request and writes one answer to out. The caller exits
// right after (without closing anything: a kernel may still hold the
// device). It returns an error only when no answer could be written.
func ServeWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	body, err := io.ReadAll(io.LimitReader(in, maxRequestBytes+1))
	if err != nil {
		return err
	}
	var resp response
	answer := func(err error) error {
		if err != nil {
			resp.Error = err.Error()
			switch {
			case errors.Is(err, ErrTimeLimit):
				resp.ErrKind = "time"
			case errors.Is(err, kernels.ErrGate):
				resp.ErrKind = "gate"
			}
		}
		b, merr := json.Marshal(&resp)
		if merr != nil {
			return merr
		}
		_, werr := out.Write(b)
		return werr
	}
	if len(body) > maxRequestBytes {
		return answer(fmt.Errorf("lab: request larger than %d bytes", maxRequestBytes))
	}
	var req request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return answer(fmt.Errorf("lab: request: %v", err))
	}
	d, err := gpu.Open(ctx, gpu.Options{Backend: req.Backend, Adapter: req.Adapter})
	if err != nil {
		return answer(err)
	}
	resp.Adapter = d.Info()
	resp.Class = kernels.ClassOf(d.Info())
	l := &Lab{Dev: d, Timeout: req.DispatchTimeout, Budget: req.Budget}
	switch req.Kind {
	case "info":
		return answer(nil)
	case "check":
		v, err := fromWire(req.Candidate)
		if err != nil {
			return answer(fmt.Errorf("%w: %v", kernels.ErrGate, err))
		}
		rep, err := l.Check(ctx, v, req.Seed)
		resp.Report = &rep
		return answer(err)
	case "compare":
		cand, err := fromWire(req.Candidate)
		if err != nil {
			return answer(fmt.Errorf("%w: %v", kernels.ErrGate, err))
		}
		base, err := fromWire(req.Baseline)
		if err != nil {
			return answer(fmt.Errorf("baseline: %v", err))
		}
		res, err := l.Compare(ctx, cand, base, req.Dims, kernels.BenchOptions{Warmup: req.Warmup, Runs: req.Runs, Seed: req.Seed})
		resp.Result = &res
		return answer(err)
	}
	return answer(fmt.Errorf("lab: request kind %q", req.Kind))
}
