package gpu

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
)

// Options configure Open. The zero value opens the best adapter of any
// backend with the defaults documented on each field.
type Options struct {
	// Backend restricts adapters to one native API (--gpu-backend).
	Backend Backend
	// Adapter, when set, picks the first adapter whose device, driver or
	// vendor name contains it (case-insensitive).
	Adapter string
	// MaxBufferSize is the largest buffer the device must hold. 0 means the
	// adapter's maximum, capped at 1 GiB. Asking for more than the adapter
	// offers fails with ErrLimit.
	MaxBufferSize uint64
	// MaxStorageBinding is the largest storage binding a kernel may see. 0
	// means min(adapter maximum, MaxBufferSize).
	MaxStorageBinding uint64
	// PoolBytes bounds the bytes of released buffers kept for reuse. 0 means
	// 256 MiB; negative disables pooling.
	PoolBytes int64
	// IdlePipelines bounds compiled pipelines kept after their last Release.
	// 0 means 64; negative keeps none.
	IdlePipelines int
	// BindGroups bounds the bind-group cache. 0 means 4096.
	BindGroups int
	// StagingBuffers is the number of mapped staging buffers Upload keeps in
	// flight. 0 means 4.
	StagingBuffers int
	// StagingSize is the size of each staging buffer. 0 means 16 MiB (on
	// the H100, 4 x 16 MiB uploaded 64 MiB at 18-19 GB/s and 16 back to
	// back at 31-35 GB/s; 4 x 8 MiB: 13-15 and 21-24; BENCHMARKS.md).
	StagingSize uint64
	// CopyWorkers is the number of goroutines that copy into a mapped
	// staging buffer (writing mapped memory from one thread is slow on
	// discrete GPUs). 0 means min(GOMAXPROCS, 16).
	CopyWorkers int
	// Logger receives debug logs. nil discards them.
	Logger *slog.Logger
	// Profile asks for the timestamp-query feature (when the adapter has
	// it) so that StartProfile can time dispatches on the GPU.
	Profile bool
	// SpinWait is how long a wait for the GPU (a read-back, a Sync) first
	// spins, looking for its completion without blocking while the poller
	// polls every few microseconds, before it blocks. A blocked waiter
	// wakes 15-60 us after its completion (the poller's sleep, then the Go
	// scheduler handing it a thread: measured on the H100's host, a paged
	// decode step waits for 33 read-backs); spinning spends a core for it.
	// 0 means 2 ms when the process may use at least 8 CPUs (GOMAXPROCS:
	// a container's quota, not the host's count), none with fewer;
	// negative: never spin.
	SpinWait time.Duration
}

const (
	defaultMaxBuffer     = 1 << 30
	defaultPoolBytes     = 256 << 20
	defaultIdlePipelines = 64
	defaultBindGroups    = 4096
	defaultStaging       = 4
	defaultStagingSize   = 16 << 20
)

func (o Options) withDefaults() Options {
	if o.PoolBytes == 0 {
		o.PoolBytes = defaultPoolBytes
	}
	if o.IdlePipelines == 0 {
		o.IdlePipelines = defaultIdlePipelines
	}
	if o.BindGroups <= 0 {
		o.BindGroups = defaultBindGroups
	}
	if o.StagingBuffers <= 0 {
		o.StagingBuffers = defaultStaging
	}
	if o.StagingSize == 0 {
		o.StagingSize = defaultStagingSize
		if o.MaxBufferSize > 0 {
			// The default never asks for more than the buffers allowed.
			o.StagingSize = min(o.StagingSize, o.MaxBufferSize/256*256)
		}
	}
	o.StagingSize = alignUp(o.StagingSize, 256)
	if o.CopyWorkers <= 0 {
		o.CopyWorkers = min(runtime.GOMAXPROCS(0), 16)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.SpinWait == 0 && runtime.GOMAXPROCS(0) >= spinCPUs {
		o.SpinWait = defaultSpinWait
	}
	return o
}

// The default SpinWait, and the CPUs a machine needs for it.
const (
	defaultSpinWait = 2 * time.Millisecond
	spinCPUs        = 8
)

// Device is an open wgpu device with its queue, buffer pool, pipeline cache
// and staging ring. All methods are safe for concurrent use. Work from all
// goroutines goes to one queue and runs in submission order.
type Device struct {
	opts   Options
	log    *slog.Logger
	info   AdapterInfo
	limits Limits // granted

	varsMu sync.Mutex
	vars   *variantTable // variants standing in for kernels (variant.go)

	inst    *wgpu.Instance
	adapter *wgpu.Adapter
	dev     *wgpu.Device
	queue   *wgpu.Queue

	// mu serializes calls into wgpu that use error scopes (the scope stack
	// is per device, not per thread) and guards the fields below.
	mu      sync.Mutex
	closed  bool
	nextID  uint64
	buffers map[uint64]*Buffer // every native buffer this device made
	pool    pool
	pipes   map[string]*pipeEntry
	layouts map[string]*layoutEntry
	bgs     bindGroupCache
	tick    uint64
	// hazardEpoch numbers the batches hazards has walked (hazard.go).
	hazardEpoch uint64
	stager      *stager
	hosts       map[*HostBuffer]struct{} // live host buffers (host.go)
	counters    counters

	timestamps bool      // the timestamp-query feature is on (Options.Profile)
	prof       *profiler // a running profile (profile.go)

	lost     atomic.Pointer[error]
	lostCh   chan struct{} // closed when lost is set
	lostOnce sync.Once

	// asynchronous operations (map, work done) not yet completed
	opsMu    sync.Mutex
	ops      map[*asyncOp]struct{}
	deferred []func() // run under mu by drain; appended by callbacks

	kick     chan struct{}
	stop     chan struct{}
	pollDone chan struct{}
	progress atomic.Uint64
	waiting  atomic.Int32 // goroutines blocked in asyncOp.wait: the poller keeps its sleeps short
	spinning atomic.Int32 // goroutines spinning in asyncOp.wait: the poller sleeps pollSpinSleep
	spinWait time.Duration
}

type counters struct {
	allocs, reuses, pipelinesBuilt uint64
	hostBytes                      uint64 // of live host buffers
	dispatches, barriers           uint64 // encoded, and those with a barrier before them (hazard.go)
}

// Open selects an adapter and opens a device on it. The device requests the
// WebGPU default limits plus buffer and storage-binding sizes raised to
// what Options ask (asking for the adapter's full limits fails on some
// drivers).
func Open(ctx context.Context, o Options) (*Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	inst := newInstance(o.Backend)
	adapter, info, err := pickAdapter(inst, o)
	if err != nil {
		inst.Release()
		return nil, err
	}
	req := wgpu.DefaultLimits()
	al := info.Limits
	maxBuf := o.MaxBufferSize
	if maxBuf == 0 {
		maxBuf = min(al.MaxBufferSize, defaultMaxBuffer)
	}
	if maxBuf > al.MaxBufferSize {
		adapter.Release()
		inst.Release()
		return nil, fmt.Errorf("%w: max buffer size %d asked; adapter %s offers %d", ErrLimit, maxBuf, info, al.MaxBufferSize)
	}
	maxBind := o.MaxStorageBinding
	if maxBind == 0 {
		maxBind = min(al.MaxStorageBufferBindingSize, maxBuf)
	}
	if maxBind > al.MaxStorageBufferBindingSize {
		adapter.Release()
		inst.Release()
		return nil, fmt.Errorf("%w: max storage binding %d asked; adapter %s offers %d", ErrLimit, maxBind, info, al.MaxStorageBufferBindingSize)
	}
	req.MaxBufferSize = maxBuf
	req.MaxStorageBufferBindingSize = maxBind
	var features []wgpu.FeatureName
	if info.ShaderF16 {
		features = append(features, wgpu.FeatureNameShaderF16)
	}
	timestamps := o.Profile && info.TimestampQuery
	if timestamps {
		features = append(features, wgpu.FeatureNameTimestampQuery)
	}
	dev, err := adapter.RequestDevice(&wgpu.DeviceDescriptor{
		Label:            "rdrr",
		RequiredFeatures: features,
		RequiredLimits:   &wgpu.RequiredLimits{Limits: req},
	})
	if err != nil {
		adapter.Release()
		inst.Release()
		return nil, fmt.Errorf("%w: request device on %s: %v", ErrUnsupported, info, err)
	}
	d := &Device{
		opts:     o,
		log:      o.Logger,
		info:     info,
		inst:     inst,
		adapter:  adapter,
		dev:      dev,
		queue:    dev.GetQueue(),
		buffers:  map[uint64]*Buffer{},
		pipes:    map[string]*pipeEntry{},
		layouts:  map[string]*layoutEntry{},
		ops:      map[*asyncOp]struct{}{},
		lostCh:   make(chan struct{}),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		pollDone: make(chan struct{}),

		timestamps: timestamps,
		spinWait:   o.SpinWait,
	}
	d.limits = limitsOf(dev.GetLimits().Limits)
	d.info.Limits = d.limits
	d.pool.limit = o.PoolBytes
	d.bgs.limit = o.BindGroups
	if err := d.probe(); err != nil {
		d.release()
		return nil, err
	}
	go d.pollLoop()
	d.log.Debug("gpu: device open", "adapter", info.String(), "maxBuffer", maxBuf, "maxBinding", maxBind)
	return d, nil
}

func pickAdapter(inst *wgpu.Instance, o Options) (*wgpu.Adapter, AdapterInfo, error) {
	type cand struct {
		a    *wgpu.Adapter
		info AdapterInfo
	}
	var cs []cand
	for _, a := range inst.EnumerateAdapters(&wgpu.InstanceEnumerateAdapterOptons{Backends: o.Backend.instanceFlags()}) {
		info := describe(a)
		if !info.matches(o.Adapter) {
			a.Release()
			continue
		}
		cs = append(cs, cand{a, info})
	}
	if len(cs) == 0 {
		return nil, AdapterInfo{}, fmt.Errorf("%w: backend %s, adapter %q", ErrNoAdapter, o.Backend, o.Adapter)
	}
	sort.SliceStable(cs, func(i, j int) bool { return rank(cs[i].info) > rank(cs[j].info) })
	for _, c := range cs[1:] {
		c.a.Release()
	}
	return cs[0].a, cs[0].info, nil
}

// probe checks that the binding's structs still hold native handles where
// native.go expects them.
func (d *Device) probe() error {
	const size = 64
	b, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{Label: "probe", Size: size, Usage: wgpu.BufferUsageCopyDst})
	if err != nil {
		return fmt.Errorf("%w: probe buffer: %v", ErrUnsupported, err)
	}
	defer func() { b.Destroy(); b.Release() }()
	return checkLayout(d.dev, b, size)
}

// Info returns the adapter's description with the limits this device was
// granted.
func (d *Device) Info() AdapterInfo { return d.info }

// LocalMemory returns the bytes of the adapter's largest device-local
// memory heap, which WebGPU does not report, and what this process can
// still allocate from it where the driver says (VK_EXT_memory_budget:
// the heap less what other processes, and this one, hold; else 0): asked
// of the Vulkan loader for the physical device of the adapter's vendor
// and device id (Linux, the Vulkan backend), 0 where it cannot tell. A
// CPU adapter's heap is host memory.
func (d *Device) LocalMemory() (size, budget uint64) {
	if d.info.Backend != BackendVulkan {
		return 0, 0
	}
	return localMemory(d.info.VendorID, d.info.DeviceID)
}

// Err returns a non-nil error (wrapping ErrDeviceLost or ErrClosed) once the
// device can no longer be used.
func (d *Device) Err() error {
	if p := d.lost.Load(); p != nil {
		return *p
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	return nil
}

// usable reports why the device cannot take work, or nil. Callers hold d.mu.
func (d *Device) usable() error {
	if d.closed {
		return ErrClosed
	}
	if p := d.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// markLost records that the device is gone and fails every waiting
// operation. Safe to call from callbacks (it never takes d.mu).
func (d *Device) markLost(reason string) {
	d.lostOnce.Do(func() {
		err := fmt.Errorf("%w: %s", ErrDeviceLost, reason)
		d.lost.Store(&err)
		close(d.lostCh)
		d.log.Warn("gpu: device lost", "reason", reason)
		d.failOps(statusLost)
	})
}

// noteNative checks an error captured by a scope for device loss and
// converts it.
func (d *Device) noteNative(ne *nativeError) error {
	if ne == nil {
		return nil
	}
	if ne.typ == errTypeDeviceLost {
		d.markLost(ne.msg)
	}
	return wrapNative(ne)
}

// Close waits for the work already submitted to finish, then frees every
// buffer, pipeline and bind group and releases the device. Buffers and
// pipelines still held by callers become unusable (their use returns
// ErrClosed). Close is idempotent.
//
// The wait has no deadline: freeing command buffers and buffers that the
// GPU is still running crashes the driver (lavapipe's queue thread did,
// issue 16), so a queue that is slow to drain (a CPU adapter on a loaded
// machine) keeps Close waiting, with a warning every closeWarnAfter. Only
// device loss ends the wait early.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	var op *asyncOp
	if d.lost.Load() == nil {
		var ne *nativeError
		op, ne = d.workDoneLocked()
		if ne != nil {
			op = nil
		}
	}
	d.closed = true
	d.mu.Unlock()
	if op != nil {
		start := time.Now()
		tick := time.NewTicker(closeWarnAfter)
	wait:
		for {
			select {
			case <-op.done:
				break wait
			case <-d.lostCh:
				break wait
			case <-tick.C:
				d.log.Warn("gpu: close: still waiting for submitted work to finish", "waited", time.Since(start).Round(time.Second))
			}
		}
		tick.Stop()
	}
	close(d.stop)
	<-d.pollDone
	d.failOps(statusClosed)
	d.release()
	return nil
}

// release frees everything native. Callers ensure no other goroutine uses
// the device (closed is set or Open failed).
func (d *Device) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.drainLocked()
	if d.stager != nil {
		d.stager.closeLocked()
	}
	d.bgs.clear()
	if d.prof != nil { // a profile never stopped: its query sets
		for _, b := range d.prof.pending {
			b.qs.Release()
		}
		d.prof = nil
	}
	for _, e := range d.pipes {
		e.pipe.Release()
	}
	d.pipes = map[string]*pipeEntry{}
	for _, l := range d.layouts {
		l.release()
	}
	d.layouts = map[string]*layoutEntry{}
	for _, b := range d.buffers {
		b.destroyLocked()
	}
	for h := range d.hosts {
		h.destroyLocked()
	}
	d.pool = pool{}
	d.queue.Release()
	d.dev.Release()
	d.adapter.Release()
	d.inst.Release()
}

// Sync waits until all work submitted before the call has finished.
func (d *Device) Sync(ctx context.Context) error {
	d.mu.Lock()
	if err := d.usable(); err != nil {
		d.mu.Unlock()
		return err
	}
	op, ne := d.workDoneLocked()
	d.mu.Unlock()
	if ne != nil {
		return d.noteNative(ne)
	}
	return op.wait(ctx, d)
}

// workDoneLocked registers an operation that completes when the queue has
// run everything submitted so far.
func (d *Device) workDoneLocked() (*asyncOp, *nativeError) {
	op := d.newOp(nil)
	ne := onWorkDone(d.dev, d.queue, op.complete)
	d.wake()
	return op, ne
}

// Stats counts what the device holds; tests use it to find leaks.
type Stats struct {
	LiveBuffers   int    `json:"liveBuffers"`   // handed out by Alloc, not yet released
	LiveBytes     uint64 `json:"liveBytes"`     // their allocated bytes
	PooledBuffers int    `json:"pooledBuffers"` // released, kept for reuse
	PooledBytes   uint64 `json:"pooledBytes"`
	NativeBuffers int    `json:"nativeBuffers"` // every wgpu buffer that exists (live, pooled, staging)
	Pipelines     int    `json:"pipelines"`     // compiled pipelines (held or idle)
	BindGroups    int    `json:"bindGroups"`    // cached bind groups
	PendingOps    int    `json:"pendingOps"`    // maps and work-done callbacks not yet fired
	Allocs        uint64 `json:"allocs"`        // native buffers created by Alloc
	Reuses        uint64 `json:"reuses"`        // Allocs served from the pool
	Compiles      uint64 `json:"compiles"`      // pipelines built
	HostBuffers   int    `json:"hostBuffers"`   // live HostBuffers
	HostBytes     uint64 `json:"hostBytes"`     // their allocated bytes
	Dispatches    uint64 `json:"dispatches"`    // encoded
	Barriers      uint64 `json:"barriers"`      // of them, those wgpu places a barrier before (hazard.go)
}

// Stats returns current counts.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.drainLocked()
	s := Stats{
		PooledBuffers: d.pool.count,
		PooledBytes:   uint64(d.pool.idle),
		NativeBuffers: len(d.buffers),
		Pipelines:     len(d.pipes),
		BindGroups:    len(d.bgs.m),
		Allocs:        d.counters.allocs,
		Reuses:        d.counters.reuses,
		Compiles:      d.counters.pipelinesBuilt,
		HostBuffers:   len(d.hosts),
		HostBytes:     d.counters.hostBytes,
		Dispatches:    d.counters.dispatches,
		Barriers:      d.counters.barriers,
	}
	for _, b := range d.buffers {
		if b.state == bufLive && b.use == usageStorage {
			s.LiveBuffers++
			s.LiveBytes += b.cap
		}
	}
	d.opsMu.Lock()
	s.PendingOps = len(d.ops)
	d.opsMu.Unlock()
	return s
}

// nativeCounts reads wgpu-native's own registry: allocated buffers,
// compute pipelines, bind groups and shader modules. Tests use it to check
// that nothing leaks below this package.
func (d *Device) nativeCounts() (buffers, pipelines, bindGroups, modules uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.inst.GenerateReport()
	var h *wgpu.HubReport
	switch {
	case r.Vulkan != nil:
		h = r.Vulkan
	case r.Metal != nil:
		h = r.Metal
	case r.Dx12 != nil:
		h = r.Dx12
	case r.Gl != nil:
		h = r.Gl
	default:
		return
	}
	return h.Buffers.NumAllocated, h.ComputePipelines.NumAllocated, h.BindGroups.NumAllocated, h.ShaderModules.NumAllocated
}

// ---- asynchronous operations and the polling goroutine ----

const (
	statusSuccess = 0
	statusLost    = 3          // WGPUBufferMapAsyncStatus_DeviceLost == WGPUQueueWorkDoneStatus_DeviceLost
	statusClosed  = 0xFFFFFFF0 // ours: the device closed before the callback
)

// asyncOp is a map or work-done request whose callback has not fired yet.
type asyncOp struct {
	d       *Device
	once    sync.Once
	done    chan struct{}
	status  uint32
	then    func(status uint32) // runs once on completion; must not take d.mu
	mu      sync.Mutex
	settled bool
	dropped bool // the waiter gave up; then must clean up
}

func (d *Device) newOp(then func(uint32)) *asyncOp {
	op := &asyncOp{d: d, done: make(chan struct{}), then: then}
	d.opsMu.Lock()
	d.ops[op] = struct{}{}
	d.opsMu.Unlock()
	return op
}

func (op *asyncOp) complete(status uint32) {
	op.once.Do(func() {
		d := op.d
		d.opsMu.Lock()
		delete(d.ops, op)
		d.opsMu.Unlock()
		op.mu.Lock()
		op.status = status
		op.settled = true
		op.mu.Unlock()
		if op.then != nil {
			op.then(status)
		}
		close(op.done)
		d.progress.Add(1)
		if status == statusLost {
			d.markLost("a callback reported device loss")
		}
	})
}

// wait blocks until op completes, ctx ends or the device is lost. On ctx
// end it marks op dropped (if it has not settled) and returns ctx.Err().
func (op *asyncOp) wait(ctx context.Context, d *Device) error {
	d.waiting.Add(1)
	defer d.waiting.Add(-1)
	if d.spinWait <= 0 || !op.spin(ctx, d) {
		if !op.block(ctx) {
			return ctx.Err() // dropped: its callback cleans up
		}
	}
	switch op.status {
	case statusSuccess:
		return nil
	case statusClosed:
		return ErrClosed
	case statusLost:
		if p := d.lost.Load(); p != nil {
			return *p
		}
		return ErrDeviceLost
	}
	return fmt.Errorf("%w: asynchronous operation failed with status %d", ErrValidation, op.status)
}

// spin looks for op's completion without blocking for up to d.spinWait,
// while the poller polls every pollSpinSleep, and reports whether op
// completed.
func (op *asyncOp) spin(ctx context.Context, d *Device) bool {
	d.spinning.Add(1)
	defer d.spinning.Add(-1)
	d.wake() // the poller sleeps at most pollSpinSleep from now
	deadline := time.Now().Add(d.spinWait)
	for i := 0; ; i++ {
		select {
		case <-op.done:
			return true
		default:
		}
		if i%64 == 63 {
			if ctx.Err() != nil || time.Now().After(deadline) {
				return false
			}
			runtime.Gosched() // others runnable on this P go first
		}
	}
}

// block waits for op's completion or ctx's end, and reports whether op
// completed. On ctx's end before the completion, op is marked dropped: its
// callback cleans up, and the waiter must not touch what op guards.
func (op *asyncOp) block(ctx context.Context) bool {
	select {
	case <-op.done:
		return true
	case <-ctx.Done():
		op.mu.Lock()
		settled := op.settled
		if !settled {
			op.dropped = true
		}
		op.mu.Unlock()
		if !settled {
			return false
		}
		<-op.done
		return true
	}
}

func (d *Device) failOps(status uint32) {
	d.opsMu.Lock()
	ops := make([]*asyncOp, 0, len(d.ops))
	for op := range d.ops {
		ops = append(ops, op)
	}
	d.opsMu.Unlock()
	for _, op := range ops {
		op.complete(status)
	}
}

// later queues f to run under d.mu at the next drain. Callbacks use it to
// hand back resources that need wgpu calls (unmap, pool return).
func (d *Device) later(f func()) {
	d.opsMu.Lock()
	d.deferred = append(d.deferred, f)
	d.opsMu.Unlock()
}

// drainLocked runs deferred work. Callers hold d.mu.
func (d *Device) drainLocked() {
	d.opsMu.Lock()
	fs := d.deferred
	d.deferred = nil
	d.opsMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// noteSubmit tells the poller that work was submitted (idx is its
// submission index; the poller only needs to know that the queue is busy).
func (d *Device) noteSubmit(idx uint64) { d.wake() }

func (d *Device) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// closeWarnAfter is how often Close logs while it waits for the queue.
const closeWarnAfter = 10 * time.Second

// Poll backoff: after a poll that changed nothing the poller sleeps
// pollMinSleep, doubling up to pollMaxSleep; a callback that fires or a new
// submission starts it again from the bottom. The sleeps are system calls
// (preciseSleep), not Go timers: the runtime waits at least a millisecond
// for a timer when the process is otherwise idle (epoll_wait takes
// milliseconds), so a 10 us timer slept ~1 ms, and every wait for the GPU
// (a read-back, a Sync, a staging buffer's return) was late by up to that.
//
// While a goroutine waits for an operation (a read-back, a Sync), the
// sleeps stop at pollWaitSleep instead: the waiter is the critical path
// (a paged decode step waits for the router's choice of every layer), and
// a sleep of up to 200 us after the GPU finished is that much late.
const (
	pollMinSleep  = 10 * time.Microsecond
	pollMaxSleep  = 200 * time.Microsecond
	pollWaitSleep = 20 * time.Microsecond
	// While a waiter spins (Options.SpinWait), the poller sleeps this
	// little between polls (a system call with 1 us of timer slack: a few
	// microseconds), so that the completion is seen at once without
	// taking wgpu's locks back to back from the goroutines that submit.
	pollSpinSleep = 2 * time.Microsecond
)

// pollLoop drives wgpu's callbacks while anything is outstanding: work on
// the queue that has not finished, or a map or work-done callback that has
// not fired. It is the device's only long-lived goroutine; Close stops it.
//
// It never makes wgpu wait (Device.Poll(true, ...)): wgpu-native v22 waits
// at most 5 s for a submission and then treats it as finished whether or
// not the GPU is done (gfx-rs/wgpu#3601 and #4589, fixed in wgpu 25 by
// #7030). It then recycles the submission's command buffers and frees the
// buffers it used while the GPU still runs them. On a loaded machine
// lavapipe takes longer than 5 s for one submission, and its queue thread
// crashed walking a freed command list (issue 16). A non-blocking poll
// reads the fence and frees only what has really finished, so the loop
// polls without waiting and sleeps between polls with a short backoff.
func (d *Device) pollLoop() {
	defer close(d.pollDone)
	pinPollThread()
	for {
		select {
		case <-d.stop:
			return
		case <-d.kick:
		}
		sleep := time.Duration(0)
		for {
			if d.lost.Load() != nil {
				d.failOps(statusLost)
				break
			}
			before := d.progress.Load()
			queueEmpty := d.dev.Poll(false, nil)
			d.opsMu.Lock()
			pending := len(d.ops)
			d.opsMu.Unlock()
			// Work submitted or registered after the poll kicks again,
			// so stopping here loses nothing.
			if queueEmpty && pending == 0 {
				break
			}
			if d.progress.Load() != before {
				sleep = 0
				continue
			}
			ceiling := pollMaxSleep
			if d.waiting.Load() > 0 {
				ceiling = pollWaitSleep
			}
			sleep = min(max(2*sleep, pollMinSleep), ceiling)
			if d.spinning.Load() > 0 {
				sleep = pollSpinSleep
			}
			preciseSleep(sleep)
			select {
			case <-d.stop:
				return
			case <-d.kick:
				sleep = 0
			default:
			}
		}
	}
}
