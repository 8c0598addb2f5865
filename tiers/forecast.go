package tiers

// Forecast is an eviction policy for a pager that walks a model's layers
// in order once per decode step and knows, for each key, its place in
// that walk (its group: the layer, SetGroup) and, for each step, the
// token it embeds (BeginStep). It evicts the entry whose next use it
// expects furthest away, as Belady's MIN would with the future known:
//
//	E = d + (1 - q) * G / max(q, q')
//
// where G is the number of groups (a step's walk) and d the distance in
// groups to the entry's next turn: in this step if its group is still
// ahead, q then the chance that this turn uses it; else in the next step,
// q = q'. q' is the chance that a step whose token is not known yet uses
// it. Both are learned, not configured: tables of use rates by what the
// policy knows of a key at a step's start (whether it was used in each of
// the last two steps, how often since its first use, and for q whether
// the last step that embedded the same token used it), counted at each
// step's end over every key seen. Routing in MoE models follows the
// token as well as recency (the same token tends to choose the same
// experts, and consecutive tokens share many), and the tables weigh each
// by what it has predicted in this run; a key the step's token does not
// want keeps the chance that a later step's does (the max). Among equal
// expectations the least used goes first, then the least recently used.
//
// Keys without a group (never given one) are evicted first, least
// recently used first: without groups Forecast is LRU. Before any
// BeginStep every access is of one step.
//
// Bounds: one record per key seen (ids are dense), and the token memory
// keeps the keys used by the last step of at most MaxTokenMemory tokens,
// forgetting the oldest. A step's end costs a pass over every key seen
// (learning); a victim compares each group's best entries, cached until
// an access, removal or step changes the group (a scan of the group when
// its best is not evictable).
type Forecast struct {
	keys []forecastKey
	// The held entries: those without a group in one list, the others
	// in their group's (each list unordered), with each group's best
	// candidates cached until an access, removal or step changes them.
	ungrouped []int32
	byGroup   []forecastGroup
	// Victim's answers of evictable in the current call (ask == call).
	call  uint32
	ask   []uint32
	ok    []bool
	cands []forecastCand // Victim's, per group
	exact []bool
	step  int32   // current step (0 before the first BeginStep)
	group int     // group of the last access (the walk's position)
	token int     // token of the current step; -1 unknown
	used  []int32 // ids used in the current step
	// memory: for each token, the ids its last step used (bounded).
	memory map[int][]int32
	order  []int // tokens in memory, oldest first
	inTok  []bool
	hasTok bool // the current step's token has a memory (inTok is its set)
	counts [forecastCells][2]float64
	// next counts the same cells with the token left out (its memory
	// "none"), over every step: a key whose turn this step is done is
	// next used in a step whose token is not known yet.
	next [forecastCells][2]float64
	// guesses counts the keys prefetched in a step and those of them the
	// step used: the chance a prefetched key's turn uses it.
	guesses [2]float64
	feat    []uint8 // per key: its cell at the current step's start
	// The tables' rates (and the guesses'), as of the current step's
	// start: they change only there (learn).
	rateOf, nextOf [forecastCells]float64
	guessRate      float64
	// sver versions the keys' cached scores: a step's start and a change
	// of G move it; an access, a prefetch or a new group clears a key's.
	sver uint32
}

// MaxTokenMemory bounds the tokens whose last step Forecast remembers.
const MaxTokenMemory = 4096

// forecastCells: used in the last step (2) x used in the one before (2) x
// how often it was used of late (forecastRates) x the token's memory
// (none, in it, not in it).
const forecastCells = 2 * 2 * forecastRates * 3

// forecastRates buckets a key's use rate (the steps that used it over the
// steps since it was first used) by powers of two: below 1/128, 1/64, ...
// 1/2, or more.
const forecastRates = 8

func rateBucket(r float32) uint8 {
	b := uint8(0)
	for t := float32(1.0 / 128); b < forecastRates-1 && r >= t; t *= 2 {
		b++
	}
	return b
}

type forecastKey struct {
	group   int32 // -1: none
	held    bool
	pos     int32   // index in its list (ungrouped or its group's)
	last    int64   // time of the last access
	u1, u2  int32   // the last two steps that used it, most recent first (-1: none)
	guessed bool    // prefetched in this step (Prefetched)
	rate    float32 // steps that used it / steps since its first use
	rb      uint8   // rateBucket(rate)
	first   int32   // the step of its first use (-1: none)
	uses    int32   // steps that used it
	// done and pend are scores' answer while sv is the policy's sver.
	done, pend float64
	sv         uint32
}

// NewForecast returns a Forecast policy.
func NewForecast() *Forecast {
	p := &Forecast{memory: map[int][]int32{}, token: -1, guesses: [2]float64{1, 2}}
	for i := range p.counts {
		p.counts[i] = [2]float64{1, 2} // a use rate of one half until measured
		p.next[i] = [2]float64{1, 2}
	}
	p.learned()
	return p
}

// learned takes the tables' rates (each at least 1e-3) for the scores
// of the step that begins.
func (p *Forecast) learned() {
	for i := range p.counts {
		p.rateOf[i] = max(p.counts[i][0]/p.counts[i][1], 1e-3)
		p.nextOf[i] = max(p.next[i][0]/p.next[i][1], 1e-3)
	}
	p.guessRate = p.guesses[0] / p.guesses[1]
	p.stale()
}

// stale drops every key's cached scores.
func (p *Forecast) stale() {
	p.sver++
	if p.sver == 0 { // wrapped: no key may match
		for i := range p.keys {
			p.keys[i].sv = 0
		}
		p.sver = 1
	}
}

func (p *Forecast) Name() string { return "forecast" }

func (p *Forecast) key(id int) *forecastKey {
	for id >= len(p.keys) {
		p.keys = append(p.keys, forecastKey{group: -1, u1: -1, u2: -1, first: -1})
		p.feat = append(p.feat, 0)
		p.inTok = append(p.inTok, false)
		p.ask = append(p.ask, 0)
		p.ok = append(p.ok, false)
	}
	return &p.keys[id]
}

// SetGroup tells p that key id is used at place group of each step's walk
// (the layer). Groups outside 0 to MaxTraceGroup are ignored (each group
// has a list and a cache).
func (p *Forecast) SetGroup(id, group int) {
	if id < 0 || group < 0 || group > MaxTraceGroup {
		return
	}
	k := p.key(id)
	if int(k.group) == group {
		return
	}
	held := k.held
	if held {
		p.unlist(id)
	}
	k.group = int32(group)
	k.sv = 0
	if group >= len(p.byGroup) {
		// G (the groups seen: the largest plus one) is in every score.
		p.byGroup = append(p.byGroup, make([]forecastGroup, group+1-len(p.byGroup))...)
		p.stale()
		p.dirtyAll()
	}
	if held {
		p.list(id)
	}
}

// forecastGroup is the held entries of one group and its cached best
// candidates (forecastBest), valid unless dirty.
type forecastGroup struct {
	ids   []int32
	dirty bool
	best  [4]forecastCand
}

// The cached candidates of a group: the best in the done form over all
// its entries, in the pending form over all, in the done form over those
// used this step, in the pending form over the rest.
const (
	doneAll = iota
	pendAll
	doneUsed
	pendUnused
)

type forecastCand struct {
	id   int32 // -1: none
	v    float64
	last int64
}

// better reports whether a is evicted before b: the larger score, then
// the least recently used, then the smaller id.
func (a forecastCand) better(b forecastCand) bool {
	if b.id < 0 {
		return a.id >= 0
	}
	if a.id < 0 {
		return false
	}
	if a.v != b.v {
		return a.v > b.v
	}
	if a.last != b.last {
		return a.last < b.last
	}
	return a.id < b.id
}

// list adds held key id to its list.
func (p *Forecast) list(id int) {
	k := &p.keys[id]
	if k.group < 0 {
		k.pos = int32(len(p.ungrouped))
		p.ungrouped = append(p.ungrouped, int32(id))
		return
	}
	g := &p.byGroup[k.group]
	k.pos = int32(len(g.ids))
	g.ids = append(g.ids, int32(id))
	g.dirty = true
}

// unlist takes held key id out of its list.
func (p *Forecast) unlist(id int) {
	k := &p.keys[id]
	l := &p.ungrouped
	if k.group >= 0 {
		g := &p.byGroup[k.group]
		g.dirty = true
		l = &g.ids
	}
	last := (*l)[len(*l)-1]
	(*l)[k.pos] = last
	p.keys[last].pos = k.pos
	*l = (*l)[:len(*l)-1]
}

func (p *Forecast) dirtyAll() {
	for i := range p.byGroup {
		p.byGroup[i].dirty = true
	}
}

// BeginStep ends the current step (learning from what it used) and
// begins one that embeds token (negative: unknown).
func (p *Forecast) BeginStep(token int) {
	// Learn: each key's cell at the step's start against its use.
	for id := range p.keys {
		k := &p.keys[id]
		if k.group < 0 {
			continue
		}
		c, n := &p.counts[p.feat[id]], &p.next[p.feat[id]/3*3]
		if k.inThisStep(p.step) {
			c[0]++
			n[0]++
			k.uses++
		}
		c[1]++
		n[1]++
		if k.guessed {
			if k.inThisStep(p.step) {
				p.guesses[0]++
			}
			p.guesses[1]++
			k.guessed = false
		}
		if k.first >= 0 {
			k.rate = float32(k.uses) / float32(p.step-k.first+1)
			k.rb = rateBucket(k.rate)
		}
	}
	p.learned()
	if p.token >= 0 {
		p.remember(p.token, p.used)
	}
	p.used = p.used[:0]
	p.step++
	p.token = token
	p.group = 0
	// The new step's token memory and every key's cell.
	for i := range p.inTok {
		p.inTok[i] = false
	}
	ids, ok := p.memory[token]
	p.hasTok = token >= 0 && ok
	if p.hasTok {
		for _, id := range ids {
			p.inTok[id] = true
		}
	}
	for id := range p.keys {
		p.feat[id] = p.cell(id, p.step, p.hasTok)
	}
	p.dirtyAll()
}

// remember keeps the ids a step of token used, forgetting the oldest
// token past MaxTokenMemory.
func (p *Forecast) remember(token int, used []int32) {
	if _, ok := p.memory[token]; !ok {
		p.order = append(p.order, token)
		if len(p.order) > MaxTokenMemory {
			delete(p.memory, p.order[0])
			p.order = p.order[1:]
		}
	}
	p.memory[token] = append(p.memory[token][:0], used...)
}

// cell is key id's cell at the start of step s: its uses in steps s-1 and
// s-2, and (withTok) whether the token's memory holds it.
func (p *Forecast) cell(id int, s int32, withTok bool) uint8 {
	k := &p.keys[id]
	used := func(t int32) bool { return t >= 0 && (k.u1 == t || k.u2 == t) }
	c := uint8(0)
	if used(s - 1) {
		c |= 2
	}
	if used(s - 2) {
		c |= 1
	}
	tok := uint8(0)
	if withTok {
		tok = 2
		if p.inTok[id] {
			tok = 1
		}
	}
	return (c*forecastRates+k.rb)*3 + tok
}

// hold lists key id as held (or marks its group changed) at time now.
func (p *Forecast) hold(id int, now int64) *forecastKey {
	k := p.key(id)
	if !k.held {
		k.held = true
		p.list(id)
	} else if k.group >= 0 {
		p.byGroup[k.group].dirty = true
	}
	k.last = now
	k.sv = 0
	return k
}

func (p *Forecast) Access(id int, _ int64, now int64, _ bool) {
	k := p.hold(id, now)
	if k.group >= 0 {
		p.group = int(k.group)
	}
	if !k.inThisStep(p.step) {
		if k.first < 0 {
			k.first = p.step
		}
		p.used = append(p.used, int32(id))
		k.u2, k.u1 = k.u1, p.step
	}
}

// inThisStep reports whether step s used the key (its last use).
func (k *forecastKey) inThisStep(s int32) bool { return k.u1 == s }

// Prefetched holds key id, loaded on a guess, without counting a use:
// the walk does not move, and its next use is forecast as any other's.
func (p *Forecast) Prefetched(id int, _ int64, now int64) {
	p.hold(id, now).guessed = true
}

func (p *Forecast) Remove(id int) {
	if id >= len(p.keys) || !p.keys[id].held {
		return
	}
	p.unlist(id)
	p.keys[id].held = false
}

// Score is the time of id's last access; the cache and the simulator use
// Victim instead.
func (p *Forecast) Score(id int) float64 {
	if id >= len(p.keys) {
		return 0
	}
	return float64(p.keys[id].last)
}

// scores returns the rule's score of grouped key id in the done form
// (its turn this step is past) and in the pending form (still ahead):
// E + c (c, the walk's position, is the same for every entry), less a
// thousandth of its use rate, so that among equals the least used goes
// first. Larger: evicted sooner.
func (p *Forecast) scores(id int) (done, pend float64) {
	k := &p.keys[id]
	if k.sv == p.sver {
		return k.done, k.pend
	}
	done, pend = p.score(id)
	k.done, k.pend, k.sv = done, pend, p.sver
	return done, pend
}

// score computes scores' answer.
func (p *Forecast) score(id int) (done, pend float64) {
	k := &p.keys[id]
	g, G := float64(k.group), float64(max(len(p.byGroup), 1))
	tie := float64(k.rate) * 1e-3
	// Done: its next turn is in the next step, whose token is not known
	// yet (the cells without it).
	n := uint8(0)
	if k.inThisStep(p.step) {
		n |= 2
	}
	if p.step > 0 && (k.u1 == p.step-1 || k.u2 == p.step-1) {
		n |= 1
	}
	done = G + g + (1/p.nextOf[(n*forecastRates+k.rb)*3]-1)*G - tie
	// Pending: used at its turn with chance q (its cell, the token
	// known); if not, later turns at the next step's rate, or q if
	// larger (a key the token does not want now is not one that no token
	// wants).
	q := p.rateOf[p.feat[id]]
	if k.guessed { // prefetched: a guess of its turn, right this often
		q = max(q, p.guessRate)
	}
	pend = g + (1-q)*G/max(q, p.nextOf[((n&1)*forecastRates+k.rb)*3]) - tie
	return done, pend
}

// isDone reports whether key id's turn this step is past at position c.
func (p *Forecast) isDone(id, c int) bool {
	k := &p.keys[id]
	g := int(k.group)
	return g < c || (g == c && k.inThisStep(p.step))
}

// value is grouped key id's score at position c, in the form its turn is
// in (isDone).
func (p *Forecast) value(id, c int) float64 {
	done, pend := p.scores(id)
	if p.isDone(id, c) {
		return done
	}
	return pend
}

// refresh recomputes group i's cached candidates.
func (p *Forecast) refresh(i int) {
	g := &p.byGroup[i]
	for j := range g.best {
		g.best[j] = forecastCand{id: -1}
	}
	for _, id32 := range g.ids {
		id := int(id32)
		done, pend := p.scores(id)
		last := p.keys[id].last
		d, q := forecastCand{id32, done, last}, forecastCand{id32, pend, last}
		if d.better(g.best[doneAll]) {
			g.best[doneAll] = d
		}
		if q.better(g.best[pendAll]) {
			g.best[pendAll] = q
		}
		if p.keys[id].inThisStep(p.step) {
			if d.better(g.best[doneUsed]) {
				g.best[doneUsed] = d
			}
		} else if q.better(g.best[pendUnused]) {
			g.best[pendUnused] = q
		}
	}
	g.dirty = false
}

// candidate is group i's best entry at position c, from its cache.
func (p *Forecast) candidate(i, c int) forecastCand {
	g := &p.byGroup[i]
	switch {
	case i < c:
		return g.best[doneAll]
	case i > c:
		return g.best[pendAll]
	}
	if a, b := g.best[doneUsed], g.best[pendUnused]; b.better(a) {
		return b
	}
	return g.best[doneUsed]
}

// evictable asks e about id once per Victim call.
func (p *Forecast) evictable(id int, e func(int) bool) bool {
	if p.ask[id] != p.call {
		p.ask[id], p.ok[id] = p.call, e(id)
	}
	return p.ok[id]
}

// Victim returns the held, evictable entry expected to be used furthest
// away (see Forecast); keys without a group first, the least recently
// used of them. Each group's best entry is cached until an access,
// removal or step changes the group; a group whose best is not
// evictable is scanned for its best evictable one, so evictable is asked
// at most once per entry.
func (p *Forecast) Victim(_ int64, evictable func(id int) bool) (int, bool) {
	p.call++
	if p.call == 0 { // wrapped: forget every answer
		clear(p.ask)
		p.call = 1
	}
	best := forecastCand{id: -1} // equal scores: the least recently used
	for _, id32 := range p.ungrouped {
		if c := (forecastCand{id32, 0, p.keys[id32].last}); p.evictable(int(id32), evictable) && c.better(best) {
			best = c
		}
	}
	if best.id >= 0 {
		return int(best.id), true
	}
	c := p.group
	cands := append(p.cands[:0], make([]forecastCand, len(p.byGroup))...)
	exact := append(p.exact[:0], make([]bool, len(p.byGroup))...) // scanned for evictable entries
	p.cands, p.exact = cands, exact
	for i := range p.byGroup {
		if p.byGroup[i].dirty {
			p.refresh(i)
		}
		cands[i] = p.candidate(i, c)
	}
	for {
		top := -1
		for i, cd := range cands {
			if cd.id >= 0 && (top < 0 || cd.better(cands[top])) {
				top = i
			}
		}
		if top < 0 {
			return -1, false
		}
		if exact[top] || p.evictable(int(cands[top].id), evictable) {
			return int(cands[top].id), true
		}
		// Its best is ruled out: the group's best evictable entry.
		cd := forecastCand{id: -1}
		for _, id32 := range p.byGroup[top].ids {
			id := int(id32)
			if !p.evictable(id, evictable) {
				continue
			}
			if n := (forecastCand{id32, p.value(id, c), p.keys[id].last}); n.better(cd) {
				cd = n
			}
		}
		cands[top], exact[top] = cd, true
	}
}
