package experts

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Budgets are the bytes a model may use at each level.
type Budgets struct {
	VRAM int64 `json:"vram"`
	RAM  int64 `json:"ram"`
	Disk int64 `json:"disk"`
}

// Plan is what mounting a model means, computed from its manifest alone:
// what stays resident in VRAM, what is paged, and how the levels share
// the experts. No weight is fetched to make it.
type Plan struct {
	ModelID string `json:"modelId"`
	Layers  int    `json:"layers"`
	// Resident parts, bytes by kind (embeddings, attention, norms, router,
	// shared_experts, dense_ffn, lm_head, other).
	Resident      map[string]int64 `json:"resident"`
	ResidentBytes int64            `json:"residentBytes"`
	// Routed experts: the paged part.
	Experts          int   `json:"experts"`
	ExpertBytes      int64 `json:"expertBytes"` // of the largest expert
	PagedBytes       int64 `json:"pagedBytes"`
	ExpertsPerToken  int   `json:"expertsPerToken"` // routed experts read per token, all layers
	ExpertReadBytes  int64 `json:"expertReadBytesPerToken"`
	ResidentPerToken int64 `json:"residentReadBytesPerToken"`
	// How the budgets place the experts (counts of experts).
	Budgets     Budgets `json:"budgets"`
	ExpertSlots int     `json:"vramExpertSlots"` // experts VRAM holds next to the resident part
	InRAM       int     `json:"ramExperts"`
	OnDisk      int     `json:"diskExperts"`
	FromSwarm   int     `json:"swarmExperts"`
	// Expected bytes paged into VRAM per token if every expert were
	// equally likely: expertReadBytesPerToken x (1 - vram share). Real
	// routing is skewed and repeats, so this is an upper estimate; the
	// tiers' recorded trace gives the real figure.
	PagedPerToken int64    `json:"pagedBytesPerTokenUniform"`
	Warnings      []string `json:"warnings,omitempty"`
}

// Mount plans m under budgets b.
func Mount(m *Manifest, b Budgets) *Plan {
	c := &m.Config
	p := &Plan{ModelID: m.ModelID, Layers: c.NumHiddenLayers, Resident: map[string]int64{}, Budgets: b}
	inExpert := make(map[string]bool, len(m.Experts)*3)
	for _, e := range m.Experts {
		for _, t := range e.Tensors {
			inExpert[t] = true
		}
		p.PagedBytes += e.Size
		p.ExpertBytes = max(p.ExpertBytes, e.Size)
	}
	p.Experts = len(m.Experts)
	for name, t := range m.Tensors {
		if !inExpert[name] {
			p.Resident[residentKind(name)] += t.Size
			p.ResidentBytes += t.Size
		}
	}
	if len(m.Experts) > 0 {
		p.ExpertsPerToken = c.MoELayers() * c.NumExpertsPerTok
		p.ExpertReadBytes = int64(p.ExpertsPerToken) * (p.PagedBytes / int64(len(m.Experts)))
	}
	// Every resident byte is read once per token, the embeddings aside
	// (one row).
	p.ResidentPerToken = p.ResidentBytes - p.Resident["embeddings"]
	left := p.Experts
	if b.VRAM < p.ResidentBytes {
		p.Warnings = append(p.Warnings, fmt.Sprintf("the resident part (%s) does not fit the VRAM budget (%s)", Bytes(p.ResidentBytes), Bytes(b.VRAM)))
	} else if p.ExpertBytes > 0 {
		p.ExpertSlots = int(min(int64(left), (b.VRAM-p.ResidentBytes)/p.ExpertBytes))
	}
	left -= p.ExpertSlots
	if p.ExpertBytes > 0 {
		p.InRAM = int(min(int64(left), b.RAM/p.ExpertBytes))
		left -= p.InRAM
		p.OnDisk = int(min(int64(left), b.Disk/p.ExpertBytes))
		left -= p.OnDisk
	}
	p.FromSwarm = left
	if p.Experts > 0 {
		miss := 1 - float64(p.ExpertSlots)/float64(p.Experts)
		p.PagedPerToken = int64(float64(p.ExpertReadBytes) * miss)
	}
	return p
}

// residentKind sorts a dense tensor into the plan's kinds by its name.
func residentKind(name string) string {
	switch {
	case strings.Contains(name, "embed"):
		return "embeddings"
	case strings.Contains(name, "lm_head") || strings.Contains(name, "output.weight"):
		return "lm_head"
	case strings.Contains(name, "norm"):
		return "norms"
	case strings.Contains(name, "attn"):
		return "attention"
	case strings.Contains(name, "shared_expert"):
		return "shared_experts"
	case strings.HasSuffix(name, "mlp.gate.weight") || strings.Contains(name, "gate_inp"):
		return "router"
	case strings.Contains(name, "mlp.") || strings.Contains(name, "ffn"):
		return "dense_ffn"
	}
	return "other"
}

// Print writes the plan for a person.
func (p *Plan) Print(w io.Writer) {
	fmt.Fprintf(w, "model %s: %d layers, %d routed experts of %s (%s paged)\n", p.ModelID, p.Layers, p.Experts, Bytes(p.ExpertBytes), Bytes(p.PagedBytes))
	fmt.Fprintf(w, "resident in VRAM: %s\n", Bytes(p.ResidentBytes))
	kinds := make([]string, 0, len(p.Resident))
	for k := range p.Resident {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-15s %s\n", k, Bytes(p.Resident[k]))
	}
	fmt.Fprintf(w, "experts by level (budgets VRAM %s, RAM %s, disk %s):\n", Bytes(p.Budgets.VRAM), Bytes(p.Budgets.RAM), Bytes(p.Budgets.Disk))
	for _, l := range []struct {
		name string
		n    int
	}{{"VRAM", p.ExpertSlots}, {"RAM", p.InRAM}, {"disk", p.OnDisk}, {"swarm", p.FromSwarm}} {
		fmt.Fprintf(w, "  %-6s %6d experts  %s\n", l.name, l.n, Bytes(int64(l.n)*p.ExpertBytes))
	}
	fmt.Fprintf(w, "per token: %d routed experts read (%s), resident read %s; paged if uniform: %s\n",
		p.ExpertsPerToken, Bytes(p.ExpertReadBytes), Bytes(p.ResidentPerToken), Bytes(p.PagedPerToken))
	for _, s := range p.Warnings {
		fmt.Fprintln(w, "warning:", s)
	}
}

// Bytes prints n with a binary unit.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
