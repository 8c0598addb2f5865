package kernels

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	gpuops "github.com/rdrr/peer/gpu/ops"
)

// An Artifact is a kernel variant: its descriptor and its WGSL, checked
// against each other. CID names the variant (the descriptor blob's CID).
type Artifact struct {
	CID        cas.CID
	Descriptor Descriptor
	WGSL       []byte
}

// NewArtifact fills in d's WGSL CID and size from src, checks the pair,
// and returns the artifact.
func NewArtifact(d Descriptor, src []byte) (*Artifact, error) {
	d.WGSL, d.WGSLSize = cas.Sum(src), int64(len(src))
	return checkArtifact(&d, src)
}

// NewVariant makes a variant of op from WGSL: the descriptor's ABI is
// this build's, its workgroup size and features are read from src (with
// consts applied), entry "" means "main". parent and author may be zero.
func NewVariant(op string, src []byte, entry string, consts map[string]float64, parent *cas.CID, author string) (*Artifact, error) {
	if !validOp(op) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownOp, op)
	}
	if entry == "" {
		entry = "main"
	}
	if len(consts) == 0 {
		consts = nil
	}
	d := Descriptor{Version: DescriptorVersion, Op: op, ABI: ABIVersion(op), Entry: entry, Constants: consts, Parent: parent, Author: author}
	text := string(src)
	wg, err := workgroupSize(text, entry, consts, overrideDefaults(text))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDescriptor, err)
	}
	d.Workgroup = wg
	if d.Features, err = enabledFeatures(text); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDescriptor, err)
	}
	return NewArtifact(d, src)
}

func checkArtifact(d *Descriptor, src []byte) (*Artifact, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if err := d.checkWGSL(src); err != nil {
		return nil, err
	}
	return &Artifact{CID: d.CID(), Descriptor: *d, WGSL: src}, nil
}

// BlobPutter stores blobs (*cas.Store).
type BlobPutter interface {
	// Put stores r's bytes and returns their CID. ctx cancels it.
	Put(ctx context.Context, r io.Reader) (cas.Info, error)
}

// BlobReader reads verified blobs (*cas.Store). Safe for concurrent use.
type BlobReader interface {
	Stat(c cas.CID) (cas.Info, error)
	// ReadAt reads verified bytes of c, like io.ReaderAt.
	ReadAt(c cas.CID, p []byte, off int64) (int, error)
}

// Put stores the artifact's WGSL and descriptor blobs.
func (a *Artifact) Put(ctx context.Context, s BlobPutter) error {
	for _, blob := range []struct {
		b    []byte
		want cas.CID
	}{{a.WGSL, a.Descriptor.WGSL}, {a.Descriptor.Encode(), a.CID}} {
		info, err := s.Put(ctx, bytes.NewReader(blob.b))
		if err != nil {
			return err
		}
		if info.CID != blob.want {
			return fmt.Errorf("kernels: the store named a blob %s; want %s", info.CID, blob.want)
		}
	}
	return nil
}

// Load reads the variant c from the store: its descriptor (strictly
// decoded), then its WGSL, each bounded before it is read and checked
// against its CID and each other.
func Load(s BlobReader, c cas.CID) (*Artifact, error) {
	b, err := readBlob(s, c, MaxDescriptorBytes)
	if err != nil {
		return nil, err
	}
	d, err := DecodeDescriptor(b)
	if err != nil {
		return nil, fmt.Errorf("variant %s: %w", c, err)
	}
	src, err := readBlob(s, d.WGSL, d.WGSLSize)
	if err != nil {
		return nil, err
	}
	a, err := checkArtifact(d, src)
	if err != nil {
		return nil, fmt.Errorf("variant %s: %w", c, err)
	}
	return a, nil
}

// readBlob reads all of c if it holds at most limit bytes.
func readBlob(s BlobReader, c cas.CID, limit int64) ([]byte, error) {
	if c.IsCollection() {
		return nil, fmt.Errorf("%w: %s is a collection", ErrDescriptor, c)
	}
	info, err := s.Stat(c)
	if err != nil {
		return nil, err
	}
	if info.Size <= 0 || info.Size > limit {
		return nil, fmt.Errorf("%w: blob %s holds %d bytes (limit %d)", ErrDescriptor, c, info.Size, limit)
	}
	b := make([]byte, info.Size)
	if _, err := s.ReadAt(c, b, 0); err != nil {
		return nil, err
	}
	if cas.Sum(b) != c {
		return nil, fmt.Errorf("%w: blob %s read back as %s", cas.ErrCorrupt, c, cas.Sum(b))
	}
	return b, nil
}

// Kernel returns the variant in the form the gpu runtime compiles: the
// op's bindings and uniform block (from its built-in kernel), the
// variant's WGSL, entry point and constants. It refuses a variant of
// another ABI version than this build's.
func (a *Artifact) Kernel() (gpu.Kernel, error) {
	d := &a.Descriptor
	spec, ok := ops[d.Op]
	if !ok {
		return gpu.Kernel{}, fmt.Errorf("%w: %q", ErrUnknownOp, d.Op)
	}
	if d.ABI != spec.abi {
		return gpu.Kernel{}, fmt.Errorf("%w: variant %s has %s ABI %d; this build runs %d", ErrDescriptor, a.CID, d.Op, d.ABI, spec.abi)
	}
	base, err := gpuops.Builtin(spec.builtin, nil)
	if err != nil {
		return gpu.Kernel{}, err
	}
	consts := make(map[string]float64, len(d.Constants))
	for n, v := range d.Constants {
		consts[n] = v
	}
	return gpu.Kernel{Name: d.Op + "@" + shortCID(a.CID), Source: string(a.WGSL), Entry: d.Entry,
		Constants: consts, Bindings: base.Bindings, Params: base.Params}, nil
}

// Builtins returns the baseline variant of every op: the built-in WGSL of
// gpu/ with the op's fixed constants, no author and no parent. Their CIDs
// change only when the WGSL or this table does.
func Builtins() (map[string]*Artifact, error) {
	out := make(map[string]*Artifact, len(ops))
	for op, spec := range ops {
		k, err := gpuops.Builtin(spec.builtin, nil)
		if err != nil {
			return nil, err
		}
		d := Descriptor{Version: DescriptorVersion, Op: op, ABI: spec.abi, Entry: "main", Constants: spec.fixed}
		if d.Workgroup, err = workgroupSize(k.Source, d.Entry, d.Constants, overrideDefaults(k.Source)); err != nil {
			return nil, fmt.Errorf("built-in %s: %w", spec.builtin, err)
		}
		if d.Features, err = enabledFeatures(k.Source); err != nil {
			return nil, fmt.Errorf("built-in %s: %w", spec.builtin, err)
		}
		a, err := NewArtifact(d, []byte(k.Source))
		if err != nil {
			return nil, fmt.Errorf("built-in %s: %w", spec.builtin, err)
		}
		out[op] = a
	}
	return out, nil
}

// RegisterBuiltins stores the baseline variants (Builtins) in s and
// returns them by op.
func RegisterBuiltins(ctx context.Context, s BlobPutter) (map[string]*Artifact, error) {
	bs, err := Builtins()
	if err != nil {
		return nil, err
	}
	for _, op := range Ops() {
		if err := bs[op].Put(ctx, s); err != nil {
			return nil, fmt.Errorf("register built-in %s: %w", op, err)
		}
	}
	return bs, nil
}

// shortCID is the tail of c's text: enough to tell variants apart in logs.
func shortCID(c cas.CID) string { s := c.String(); return s[len(s)-10:] }
