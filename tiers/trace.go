package tiers

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// A Trace is a sequence of accesses to keys, as the pager makes them:
// TRACE.md gives the text format, which Write and ReadTrace implement.
type Trace struct {
	Keys     []TraceKey
	Accesses []Access
	// Tokens maps a step (Access.Token) to the token it embeds, where the
	// pager said (Cache.BeginStep).
	Tokens map[int]int
}

// Grouped is t with only the accesses of keys in a group (Cache.SetGroup:
// the GPU pager gives each expert matrix its layer), the keys that a VRAM
// level of expert slots holds: a model's dense tensors, read once through
// the cache when it loads, are not among them and would count as misses
// that no VRAM budget could avoid. Keys not in a group keep their ids,
// with size 0, so that Bytes counts only the others.
func (t *Trace) Grouped() *Trace {
	g := &Trace{Keys: slices.Clone(t.Keys), Tokens: maps.Clone(t.Tokens)}
	for i := range g.Keys {
		if g.Keys[i].Group < 0 {
			g.Keys[i].Size = 0
		}
	}
	for _, a := range t.Accesses {
		if a.Key >= 0 && a.Key < len(t.Keys) && t.Keys[a.Key].Group >= 0 {
			g.Accesses = append(g.Accesses, a)
		}
	}
	return g
}

// Bytes is the size of all the trace's keys together: the budget that
// holds every one of them.
func (t *Trace) Bytes() int64 {
	var n int64
	for _, k := range t.Keys {
		n += k.Size
	}
	return n
}

// TraceKey is one key of a trace: its size and a label (for MoE traces,
// "L<layer>E<expert>"; for cache keys, "<cid>:<off>+<len>"), and its
// group (the layer whose walk uses it; -1: none).
type TraceKey struct {
	Size  int64
	Label string
	Group int
}

// Access is one access: a demand (the pager needs the key now) or a
// prefetch request, made while generating token Token. A prefetch
// recorded by a cache names the level it promoted to (To).
type Access struct {
	Token    int
	Key      int
	Prefetch bool
	To       TraceLevel
}

// A TraceLevel is the level a traced prefetch promoted to: TraceAny
// where the trace does not say (one byte, so that an Access stays three
// words).
type TraceLevel uint8

const (
	TraceAny TraceLevel = iota
	TraceVRAM
	TraceRAM
)

// traceLevel is level's TraceLevel (TraceAny for the levels below RAM,
// to which nothing is prefetched).
func traceLevel(level Level) TraceLevel {
	switch level {
	case VRAM:
		return TraceVRAM
	case RAM:
		return TraceRAM
	}
	return TraceAny
}

func (l TraceLevel) String() string {
	switch l {
	case TraceVRAM:
		return VRAM.String()
	case TraceRAM:
		return RAM.String()
	}
	return ""
}

// Limits of ReadTrace.
const (
	MaxTraceKeys     = 1 << 24
	MaxTraceAccesses = 1 << 28
	MaxTraceGroup    = 1<<12 - 1 // groups are layers: DeepSeek-V3 has 61
	MaxTraceToken    = 1<<31 - 1
)

const traceMagic = "# rdrr-trace/1"

// Write writes t in the text format of TRACE.md.
func (t *Trace) Write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, traceMagic)
	for i, k := range t.Keys {
		if k.Group >= 0 {
			fmt.Fprintf(bw, "k %d %d %s %d\n", i, k.Size, k.Label, k.Group)
		} else {
			fmt.Fprintf(bw, "k %d %d %s\n", i, k.Size, k.Label)
		}
	}
	for _, step := range slices.Sorted(maps.Keys(t.Tokens)) {
		fmt.Fprintf(bw, "t %d %d\n", step, t.Tokens[step])
	}
	for _, a := range t.Accesses {
		switch {
		case !a.Prefetch:
			fmt.Fprintf(bw, "a %d %d\n", a.Token, a.Key)
		case a.To == TraceAny:
			fmt.Fprintf(bw, "p %d %d\n", a.Token, a.Key)
		default:
			fmt.Fprintf(bw, "p %d %d %s\n", a.Token, a.Key, a.To)
		}
	}
	return bw.Flush()
}

// ReadTrace parses a trace, bounding every number before using it.
func ReadTrace(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	if !sc.Scan() || sc.Text() != traceMagic {
		return nil, fmt.Errorf("trace: first line is not %q", traceMagic)
	}
	t := &Trace{}
	line := 1
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		bad := func(why string) error { return fmt.Errorf("trace line %d: %s", line, why) }
		switch f[0] {
		case "k":
			if len(f) != 4 && len(f) != 5 {
				return nil, bad("want k <id> <size> <label> [<group>]")
			}
			id, err1 := strconv.Atoi(f[1])
			size, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil || id != len(t.Keys) || size <= 0 || size > 1<<40 {
				return nil, bad("key ids must count up from 0 and sizes be 1 to 2^40")
			}
			group := -1
			if len(f) == 5 {
				g, err := strconv.Atoi(f[4])
				if err != nil || g < 0 || g > MaxTraceGroup {
					return nil, bad(fmt.Sprintf("a group is 0 to %d", MaxTraceGroup))
				}
				group = g
			}
			if len(t.Keys) >= MaxTraceKeys {
				return nil, bad("too many keys")
			}
			t.Keys = append(t.Keys, TraceKey{size, f[3], group})
		case "t":
			if len(f) != 3 {
				return nil, bad("want t <step> <token>")
			}
			step, err1 := strconv.Atoi(f[1])
			tok, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil || step < 0 || tok < 0 || tok > MaxTraceToken {
				return nil, bad(fmt.Sprintf("a step is 0 or more and a token 0 to %d", MaxTraceToken))
			}
			if t.Tokens == nil {
				t.Tokens = map[int]int{}
			}
			if _, dup := t.Tokens[step]; !dup && len(t.Tokens) >= MaxTraceAccesses {
				return nil, bad("too many steps")
			}
			t.Tokens[step] = tok
		case "a", "p":
			to := TraceAny
			if f[0] == "p" && len(f) == 4 {
				switch f[3] {
				case VRAM.String():
					to = TraceVRAM
				case RAM.String():
					to = TraceRAM
				default:
					return nil, bad("a prefetch's level is vram or ram")
				}
				f = f[:3]
			}
			if len(f) != 3 {
				return nil, bad("want a <token> <key> or p <token> <key> [vram|ram]")
			}
			tok, err1 := strconv.Atoi(f[1])
			id, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil || tok < 0 || id < 0 || id >= len(t.Keys) {
				return nil, bad("unknown key or negative token")
			}
			if len(t.Accesses) >= MaxTraceAccesses {
				return nil, bad("too many accesses")
			}
			t.Accesses = append(t.Accesses, Access{tok, id, f[0] == "p", to})
		default:
			return nil, bad("unknown record " + strconv.Quote(f[0]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace line %d: %w", line+1, err)
	}
	return t, nil
}

// MoETraceParams shape a synthetic MoE routing trace. For each token and
// each layer, TopK experts are chosen: each of the previous token's
// experts in that layer is kept with probability Reuse (temporal
// locality), and the rest are drawn from a Zipf popularity with exponent
// Skew over a fixed random ranking of the layer's experts.
type MoETraceParams struct {
	Layers, Experts, TopK int
	Tokens                int
	ExpertBytes           int64
	Skew                  float64 // Zipf exponent of popularity (0: uniform)
	Reuse                 float64 // chance an expert of the last token is chosen again
	Seed                  uint64
}

// DefaultMoETrace is the synthetic trace of the policy report: Mixtral's
// routing shape (32 layers, 8 experts, top-2) over 2000 tokens, a Zipf
// skew of 1.0 and a reuse of 0.5 (about what published routing analyses
// of Mixtral report for consecutive tokens).
var DefaultMoETrace = MoETraceParams{Layers: 32, Experts: 8, TopK: 2, Tokens: 2000, ExpertBytes: 99090432, Skew: 1.0, Reuse: 0.5, Seed: 1}

// DeepSeekMoETrace has DeepSeek-V3's routing shape: 58 MoE layers of 256
// experts, top-8.
var DeepSeekMoETrace = MoETraceParams{Layers: 58, Experts: 256, TopK: 8, Tokens: 1000, ExpertBytes: 26443776, Skew: 1.0, Reuse: 0.5, Seed: 1}

// SyntheticMoETrace makes a trace with the given parameters.
func SyntheticMoETrace(p MoETraceParams) (*Trace, error) {
	if p.Layers <= 0 || p.Experts <= 0 || p.TopK <= 0 || p.TopK > p.Experts || p.Tokens < 0 ||
		int64(p.Layers)*int64(p.Experts) > MaxTraceKeys || int64(p.Tokens)*int64(p.Layers)*int64(p.TopK) > MaxTraceAccesses {
		return nil, fmt.Errorf("trace: bad parameters %+v", p)
	}
	r := rand.New(rand.NewPCG(p.Seed, 0x7261636b))
	t := &Trace{}
	for l := 0; l < p.Layers; l++ {
		for e := 0; e < p.Experts; e++ {
			t.Keys = append(t.Keys, TraceKey{p.ExpertBytes, fmt.Sprintf("L%dE%d", l, e), l})
		}
	}
	// Popularity: weight 1/(rank+1)^skew over a random ranking per layer.
	cum := make([][]float64, p.Layers)
	for l := range cum {
		perm := r.Perm(p.Experts)
		w := make([]float64, p.Experts)
		for e, rank := range perm {
			w[e] = math.Pow(float64(rank+1), -p.Skew)
		}
		cum[l] = make([]float64, p.Experts)
		s := 0.0
		for e := range w {
			s += w[e]
			cum[l][e] = s
		}
	}
	prev := make([][]int, p.Layers)
	for tok := 0; tok < p.Tokens; tok++ {
		for l := 0; l < p.Layers; l++ {
			chosen := make([]int, 0, p.TopK)
			has := func(e int) bool {
				for _, c := range chosen {
					if c == e {
						return true
					}
				}
				return false
			}
			for _, e := range prev[l] {
				if r.Float64() < p.Reuse {
					chosen = append(chosen, e)
				}
			}
			for len(chosen) < p.TopK {
				c := cum[l]
				e := sort.SearchFloat64s(c, r.Float64()*c[len(c)-1])
				if e < p.Experts && !has(e) {
					chosen = append(chosen, e)
				}
			}
			for _, e := range chosen {
				t.Accesses = append(t.Accesses, Access{Token: tok, Key: l*p.Experts + e})
			}
			prev[l] = chosen
		}
	}
	return t, nil
}

// ErrBadTrace: a trace that names keys it does not define.
var ErrBadTrace = errors.New("trace: bad access")
