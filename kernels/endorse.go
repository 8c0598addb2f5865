package kernels

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Endorser measures a variant on this device and, when it passes the gate
// and meets the endorsing rule against the op's active variant, signs an
// endorsement, stores it and gossips it. Not safe for concurrent use (the
// gate and the benchmark are not).
type Endorser struct {
	Registry  *Registry
	Store     BlobReader
	Gate      Gate
	Bench     Bench
	Class     DeviceClass
	Key       crypto.PrivKey       // the peer identity's key
	Tool      string               // tool version recorded in endorsements
	Baselines map[string]*Artifact // op -> built-in variant (Builtins)
	Gossip    Gossip               // nil: store only
	Now       func() time.Time     // nil: time.Now
}

// EndorseResult is what Endorse measured, and the endorsement when it made
// one.
type EndorseResult struct {
	Variant  *Artifact
	Baseline *Artifact
	Report   GateReport
	Result   BenchResult
	Speedup  Speedup
	Signed   *SignedEndorsement // nil when not endorsed
}

// Endorse gates variant c (from the store), times it against the op's
// active variant on dims (the op's shape, ShapeDims order) and endorses it
// if the rule holds. The error says why not (wrapping ErrGate,
// ErrTooFast or ErrNotEndorsable); the result holds what was measured
// until then.
func (e *Endorser) Endorse(ctx context.Context, c cas.CID, dims []int, opt BenchOptions) (EndorseResult, error) {
	var r EndorseResult
	v, err := Load(e.Store, c)
	if err != nil {
		return r, err
	}
	r.Variant = v
	op := v.Descriptor.Op
	if v.Descriptor.ABI != ABIVersion(op) {
		return r, fmt.Errorf("%w: %s ABI %d; this build runs %d", ErrDescriptor, op, v.Descriptor.ABI, ABIVersion(op))
	}
	if r.Baseline, err = baselineOf(e.Registry, e.Store, e.Baselines, op); err != nil {
		return r, err
	}
	if r.Baseline.CID == v.CID {
		return r, fmt.Errorf("kernels: %s is already %s's active variant", c, op)
	}
	if _, err := Bucket(op, dims...); err != nil {
		return r, err
	}
	if opt.Seed == 0 {
		opt.Seed = freshSeed()
	}
	if r.Report, err = e.Gate.Check(ctx, v, opt.Seed); err != nil {
		return r, err
	}
	if r.Result, err = e.Bench.Compare(ctx, v, r.Baseline, dims, opt); err != nil {
		return r, err
	}
	if r.Speedup, err = Summarize(r.Result); err != nil {
		return r, err
	}
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	id, err := peer.IDFromPrivateKey(e.Key)
	if err != nil {
		return r, err
	}
	end, err := NewEndorsement(r.Result, Claim{Kernel: c, Baseline: r.Baseline.CID, ABI: ABIVersion(op), Class: e.Class,
		Peer: id, Tool: e.Tool, Issued: now(), Nonce: freshSeed()})
	if err != nil {
		return r, err
	}
	if r.Signed, err = Sign(end, e.Key); err != nil {
		return r, err
	}
	if _, err := e.Registry.AddEndorsement(r.Signed); err != nil {
		return r, err
	}
	if e.Gossip != nil {
		if err := Publish(e.Gossip, r.Signed); err != nil {
			return r, fmt.Errorf("endorsed and stored, not gossiped: %w", err)
		}
	}
	return r, nil
}

// baselineOf returns the variant a candidate of op must beat: the active
// one, or the built-in.
func baselineOf(reg *Registry, s BlobReader, builtins map[string]*Artifact, op string) (*Artifact, error) {
	if active := reg.Active(op); active != Builtin {
		c, err := cas.ParseCID(active)
		if err != nil {
			return nil, err
		}
		a, err := Load(s, c)
		if err != nil {
			return nil, fmt.Errorf("active variant of %s: %w", op, err)
		}
		return a, nil
	}
	if b := builtins[op]; b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("kernels: no baseline for %s", op)
}
