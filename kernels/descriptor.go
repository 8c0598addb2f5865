package kernels

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// A Descriptor says how to run a WGSL blob as a variant of an op. It is
// stored as its own blob (Encode), so a variant's name is its descriptor's
// CID; the WGSL is another blob, named by WGSL. The layout of the bindings
// and of the uniform block is not in the descriptor: it is the op's, fixed
// by the ABI version, so every variant of an op plugs into the same call.
//
// The encoding is canonical JSON (RFC 8785): the fields below in this
// (sorted) order, no white space, empty optional fields left out. Decode
// refuses any other spelling, so one descriptor has one CID.
type Descriptor struct {
	ABI       int                `json:"abi"`                 // the op's ABI version
	Author    string             `json:"author,omitempty"`    // peer ID; empty for the built-ins
	Constants map[string]float64 `json:"constants,omitempty"` // values of WGSL override declarations
	Entry     string             `json:"entry"`               // entry point
	Features  []string           `json:"features,omitempty"`  // device features the WGSL enables, sorted
	Op        string             `json:"op"`
	Parent    *cas.CID           `json:"parent,omitempty"` // the descriptor this one was derived from
	Version   int                `json:"v"`
	WGSL      cas.CID            `json:"wgsl"`      // raw CID of the WGSL blob
	WGSLSize  int64              `json:"wgslSize"`  // its size, so a fetch is bounded before it starts
	Workgroup [3]uint32          `json:"workgroup"` // the entry point's workgroup size, constants applied
}

// DescriptorVersion is the version of the descriptor format.
const DescriptorVersion = 1

// Limits on descriptors and WGSL.
const (
	MaxDescriptorBytes = 4096
	MaxWGSLBytes       = 256 << 10
	maxConstants       = 32
	maxWorkgroup       = 1024 // invocations; a device may allow fewer
)

// Features a descriptor may require, and the WGSL enable directive of each.
var featureEnables = map[string]string{"shader-f16": "f16", "subgroups": "subgroups"}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Encode returns the descriptor's canonical bytes: the blob it is stored as.
func (d *Descriptor) Encode() []byte {
	b, err := json.Marshal(d)
	if err != nil {
		// Only non-finite constants fail to marshal; check refuses them.
		panic(fmt.Sprintf("kernels: encode descriptor: %v", err))
	}
	return b
}

// CID is the name of the variant: the CID of Encode's bytes.
func (d *Descriptor) CID() cas.CID { return cas.Sum(d.Encode()) }

// DecodeDescriptor parses a descriptor blob strictly: at most
// MaxDescriptorBytes, no unknown fields, no trailing data, every field in
// bounds, and the canonical encoding only. Errors wrap ErrDescriptor.
func DecodeDescriptor(b []byte) (*Descriptor, error) {
	if len(b) > MaxDescriptorBytes {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrDescriptor, len(b), MaxDescriptorBytes)
	}
	var d Descriptor
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDescriptor, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrDescriptor)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	if !bytes.Equal(d.Encode(), b) {
		return nil, fmt.Errorf("%w: not canonical", ErrDescriptor)
	}
	return &d, nil
}

// check validates the fields on their own (not against the WGSL).
func (d *Descriptor) check() error {
	bad := func(f string, args ...any) error { return fmt.Errorf("%w: %s", ErrDescriptor, fmt.Sprintf(f, args...)) }
	switch {
	case d.Version != DescriptorVersion:
		return bad("version %d (want %d)", d.Version, DescriptorVersion)
	case !validOp(d.Op):
		return bad("unknown op %q", d.Op)
	case d.ABI <= 0 || d.ABI > 1000:
		return bad("abi %d", d.ABI)
	case !identifier.MatchString(d.Entry):
		return bad("entry point %q is not an identifier", d.Entry)
	case d.WGSL.IsZero() || d.WGSL.IsCollection():
		return bad("wgsl must be a raw CID")
	case d.WGSLSize <= 0 || d.WGSLSize > MaxWGSLBytes:
		return bad("wgsl of %d bytes (1..%d)", d.WGSLSize, MaxWGSLBytes)
	case d.Parent != nil && (d.Parent.IsZero() || d.Parent.IsCollection()):
		return bad("parent must be a raw CID")
	case len(d.Constants) > maxConstants:
		return bad("%d constants (at most %d)", len(d.Constants), maxConstants)
	}
	n := uint64(1)
	for _, w := range d.Workgroup {
		if w == 0 || w > maxWorkgroup {
			return bad("workgroup size %v", d.Workgroup)
		}
		n *= uint64(w)
	}
	if n > maxWorkgroup {
		return bad("workgroup of %d invocations (at most %d)", n, maxWorkgroup)
	}
	for name, v := range d.Constants {
		if !identifier.MatchString(name) {
			return bad("constant %q is not an identifier", name)
		}
		if math.IsNaN(v) || math.Abs(v) > 1<<32 {
			return bad("constant %s = %g (finite, at most 2^32 in magnitude)", name, v)
		}
	}
	if len(d.Features) > len(featureEnables) || !sort.StringsAreSorted(d.Features) {
		return bad("features %q (sorted, from %v)", d.Features, featureNames())
	}
	for i, f := range d.Features {
		if _, ok := featureEnables[f]; !ok || (i > 0 && d.Features[i-1] == f) {
			return bad("feature %q (want one of %v, once)", f, featureNames())
		}
	}
	if d.Author != "" {
		if err := canonicalPeer(d.Author); err != nil {
			return bad("author: %v", err)
		}
	}
	return nil
}

func featureNames() []string {
	var names []string
	for f := range featureEnables {
		names = append(names, f)
	}
	sort.Strings(names)
	return names
}

// canonicalPeer checks that s is a peer ID in its canonical (base58)
// spelling: a peer has one name, so it cannot vote twice under two.
func canonicalPeer(s string) error {
	id, err := peer.Decode(s)
	if err != nil {
		return err
	}
	if id.String() != s {
		return fmt.Errorf("%q is not the canonical spelling %q", s, id.String())
	}
	return nil
}

// overrideDecl matches `override NAME [: TYPE] [= EXPR];` (as gpu does).
var overrideDecl = regexp.MustCompile(`\boverride\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*[A-Za-z0-9_<>]+)?\s*(?:=\s*([^;]+))?;`)

// workgroupAttr matches `@workgroup_size(ARGS)`.
var workgroupAttr = regexp.MustCompile(`@workgroup_size\s*\(([^)]*)\)`)

// enableDirective matches `enable NAME[, NAME];`.
var enableDirective = regexp.MustCompile(`(?m)^\s*enable\s+([A-Za-z0-9_,\s]+);`)

// checkWGSL checks that src is the WGSL d describes: its size and CID,
// text without NUL, an entry point d.Entry whose workgroup size (with d's
// constants) is d.Workgroup, an override for every constant, and enable
// directives for exactly d.Features. The compiler (gpu) checks the rest.
func (d *Descriptor) checkWGSL(src []byte) error {
	bad := func(f string, args ...any) error {
		return fmt.Errorf("%w: wgsl %s: %s", ErrDescriptor, d.WGSL, fmt.Sprintf(f, args...))
	}
	if int64(len(src)) != d.WGSLSize {
		return bad("%d bytes; the descriptor says %d", len(src), d.WGSLSize)
	}
	if cas.Sum(src) != d.WGSL {
		return bad("bytes hash to %s", cas.Sum(src))
	}
	if !utf8.Valid(src) || bytes.IndexByte(src, 0) >= 0 {
		return bad("not UTF-8 text")
	}
	text := string(src)
	defaults := overrideDefaults(text)
	for name := range d.Constants {
		if _, ok := defaults[name]; !ok {
			return bad("constant %s is not an override", name)
		}
	}
	wg, err := workgroupSize(text, d.Entry, d.Constants, defaults)
	if err != nil {
		return bad("%v", err)
	}
	if wg != d.Workgroup {
		return bad("workgroup size %v; the descriptor says %v", wg, d.Workgroup)
	}
	enabled, err := enabledFeatures(text)
	if err != nil {
		return bad("%v", err)
	}
	if strings.Join(enabled, ",") != strings.Join(d.Features, ",") {
		return bad("enables %q; the descriptor requires %q", enabled, d.Features)
	}
	return nil
}

// workgroupSize finds the @workgroup_size attribute of fn entry and
// evaluates it: integer literals, or overrides with a constant or an
// integer default.
func workgroupSize(src, entry string, consts map[string]float64, defaults map[string]string) ([3]uint32, error) {
	fn := regexp.MustCompile(`\bfn\s+` + regexp.QuoteMeta(entry) + `\s*\(`).FindStringIndex(src)
	if fn == nil {
		return [3]uint32{}, fmt.Errorf("no entry point %s", entry)
	}
	// The attributes of fn are between the end of the previous
	// declaration and fn.
	head := src[:fn[0]]
	head = head[max(strings.LastIndexAny(head, ";}"), 0):]
	m := workgroupAttr.FindStringSubmatch(head)
	if m == nil {
		return [3]uint32{}, fmt.Errorf("entry point %s has no @workgroup_size", entry)
	}
	args := strings.Split(strings.TrimSuffix(strings.TrimSpace(m[1]), ","), ",")
	if len(args) > 3 {
		return [3]uint32{}, fmt.Errorf("@workgroup_size(%s)", m[1])
	}
	wg := [3]uint32{1, 1, 1}
	for i, a := range args {
		a = strings.TrimSpace(a)
		if identifier.MatchString(a) {
			if v, ok := consts[a]; ok {
				a = strconv.FormatFloat(v, 'f', -1, 64)
			} else if def, ok := defaults[a]; ok {
				a = def
			} else {
				return [3]uint32{}, fmt.Errorf("workgroup size %s is not an override", a)
			}
		}
		v, err := strconv.ParseUint(strings.TrimRight(a, "ui"), 10, 32)
		if err != nil || v == 0 || v > maxWorkgroup {
			return [3]uint32{}, fmt.Errorf("workgroup size %q is not an integer in 1..%d", a, maxWorkgroup)
		}
		wg[i] = uint32(v)
	}
	return wg, nil
}

// enabledFeatures returns the features src's enable directives need,
// sorted.
func enabledFeatures(src string) ([]string, error) {
	var out []string
	for _, m := range enableDirective.FindAllStringSubmatch(src, -1) {
		for _, e := range strings.Split(m[1], ",") {
			e = strings.TrimSpace(e)
			f := ""
			for name, directive := range featureEnables {
				if directive == e {
					f = name
				}
			}
			if f == "" {
				return nil, fmt.Errorf("enables %q, which no descriptor feature names", e)
			}
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out, nil
}

// overrideDefaults maps each override of src to its default expression
// ("" without one).
func overrideDefaults(src string) map[string]string {
	defaults := map[string]string{}
	for _, m := range overrideDecl.FindAllStringSubmatch(src, -1) {
		defaults[m[1]] = strings.TrimSpace(m[2])
	}
	return defaults
}
