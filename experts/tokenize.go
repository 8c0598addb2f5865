package experts

import (
	"container/heap"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Token types of GGUF's tokenizer.ggml.token_type (llama.cpp's
// llama_token_type).
const (
	tokenNormal      = 1
	tokenUnknown     = 2
	tokenControl     = 3
	tokenUserDefined = 4
	tokenUnused      = 5
	tokenByte        = 6
)

// MaxPromptBytes bounds the text Encode takes.
const MaxPromptBytes = 1 << 20

// ErrPromptTooLong is returned by Encode for more than MaxPromptBytes.
var ErrPromptTooLong = errors.New("prompt too long")

// spmSpace is SentencePiece's visible space, U+2581.
const spmSpace = "\u2581"

// TokenCodec encodes text into a model's tokens and decodes tokens into
// text, from the tokenizer data a GGUF file carries (Tokenizer). First,
// as llama.cpp does, the vocabulary's user-defined tokens (type 4) are
// found in the raw text: from each position the longest that starts
// there becomes its token, and the text between them is encoded by the
// model's algorithm:
//
//   - model "llama": SentencePiece BPE as llama.cpp runs it. The text gets
//     a "▁" prefix (unless add_space_prefix is false) and its spaces
//     become "▁"; starting from its UTF-8
//     characters, the adjacent pair whose concatenation is a token with the
//     highest score merges first (ties: leftmost); a character that is no
//     token becomes its bytes' "<0xXX>" tokens, or the unknown token.
//   - model "gpt2": byte-level BPE. The text is cut by the pre-tokenizer
//     that tokenizer.ggml.pre names (tokenize_split.go: GPT-2's, Llama 3's,
//     Qwen2's, DeepSeek-V3's, DeepSeek-LLM's, DeepSeek-Coder's, StarCoder's,
//     Falcon's; GPT-2's, with a Warning, for a name not known here), each
//     piece's bytes are mapped to GPT-2's printable characters, and pairs
//     merge in the order of the merges list (lowest rank first, ties
//     leftmost). For Llama 3's names a piece that is a token is taken
//     whole, as llama.cpp does.
//
// Where the model's own tokenizer normalizes text to NFC (Qwen2's), the
// text between user-defined tokens is normalized too (llama.cpp does not).
// Against llama.cpp's test vectors and Hugging Face's (TestLlamaVocab)
// the ids are Hugging Face's.
//
// Special tokens follow the model's metadata where it has it and
// llama.cpp's defaults where not: BOS is prepended when add_bos says so,
// or by default for llama models and Llama 3's pre-tokenizer names; EOS is
// appended only when add_eos says so. The unknown token is the one
// unknown_token_id names, else the first token of type 2 (for llama also
// "<unk>").
//
// Text never becomes a control, unknown or byte token, nor BOS or EOS
// whatever their type, neither by the first pass nor by the vocabulary
// lookup after the merges, so a prompt cannot spell out "</s>" (llama.cpp
// matches control tokens in the text only when asked to parse special
// tokens, as EncodeSpecial does). User-defined tokens longer than
// maxUserTokenBytes are not looked for in the text (a llama model's
// merges may still reach them), with a Warning.
//
// A token found by the first pass may strip the whitespace next to it
// (the tokenizer's LStrip and RStrip; llama.cpp's LSTRIP and RSTRIP
// attributes, which it sets for Phi-3's special tokens, among others):
// the ASCII whitespace between it and the text on that side is dropped,
// so that "<|user|>\n Hello" reads as "<|user|>Hello".
type TokenCodec struct {
	t            *Tokenizer
	spm          bool
	spacePrefix  bool           // SPM: "▁" in front of the text (add_space_prefix)
	ids          map[string]int // text -> token, for tokens text may become (BPE: GPT-2's mapped text; no user-defined token)
	unk          int            // -1: none
	addBOS       bool
	addEOS       bool
	split        func(text string, yield func(string) bool) // BPE: the pre-tokenizer
	ignoreMerges bool                                       // BPE: a piece that is a token is taken whole
	nfc          bool                                       // BPE: text is normalized to NFC before the split
	user         *userTokens                                // user-defined tokens, matched in the text first; nil for none
	special      *userTokens                                // EncodeSpecial's: user-defined, control and unknown tokens; nil for none
	warning      string
	byteTok      [256]int     // SPM: <0xXX>; BPE: the mapped byte's token; -1: none
	byteVal      []int16      // SPM: the byte a byte token stands for, -1 for other tokens
	ranks        map[pair]int // BPE: merge -> rank
}

type pair struct{ a, b string }

// NewTokenCodec checks a tokenizer and makes its codec. Models other than
// llama and gpt2 are refused.
func NewTokenCodec(t *Tokenizer) (*TokenCodec, error) {
	if t == nil {
		return nil, errors.New("tokenizer: none")
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	c := &TokenCodec{t: t, unk: -1, ids: make(map[string]int, len(t.Tokens))}
	switch t.Model {
	case "llama":
		c.spm = true
		c.addBOS = t.BOS >= 0
	case "gpt2":
		var pre preTokenizer
		pre, c.warning = lookupPre(t.Pre)
		c.split, c.ignoreMerges, c.nfc = pre.split, pre.ignoreMerges, pre.nfc
		c.addBOS = t.BOS >= 0 && pre.addBOS
	default:
		return nil, fmt.Errorf("tokenizer: model %q is not supported (llama and gpt2 are)", t.Model)
	}
	// validate checked that a flag set to true has its token.
	if t.AddBOS != nil {
		c.addBOS = *t.AddBOS
	}
	if t.AddEOS != nil {
		c.addEOS = *t.AddEOS
	}
	c.spacePrefix = c.spm && (t.AddSpacePrefix == nil || *t.AddSpacePrefix)
	for i := range c.byteTok {
		c.byteTok[i] = -1
	}
	if c.spm {
		c.byteVal = make([]int16, len(t.Tokens))
	}
	for id, s := range t.Tokens {
		typ := c.typ(id)
		if c.spm {
			c.byteVal[id] = -1
			b, isByte := parseByteToken(s)
			if typ == tokenByte && !isByte {
				return nil, fmt.Errorf("tokenizer: token %d (%q) is of type byte but not <0xXX>", id, s)
			}
			if isByte && (typ == tokenByte || t.Types == nil) {
				c.byteVal[id] = int16(b)
				if c.byteTok[b] < 0 {
					c.byteTok[b] = id
				}
				continue
			}
		}
		switch typ {
		case tokenUnknown:
			if c.unk < 0 {
				c.unk = id
			}
			continue
		case tokenControl, tokenByte:
			continue
		case tokenUserDefined:
			if !c.spm {
				// Its text is raw text, not GPT-2's mapped bytes: only the
				// first pass (userTokens) finds it. (llama.cpp also looks
				// it up among the merged pieces, where DeepSeek's "ü",
				// added for the byte FC its vocabulary lacks, turns that
				// byte into the two of ü.)
				continue
			}
		}
		c.ids[s] = id // the last of duplicates, as llama.cpp
	}
	switch {
	case t.UNK != nil:
		// The metadata's: text never becomes it, whatever its type.
		c.unk = *t.UNK
		if s := t.Tokens[c.unk]; c.ids[s] == c.unk {
			delete(c.ids, s)
		}
	case c.unk < 0 && c.spm:
		if id, ok := c.ids["<unk>"]; ok {
			c.unk = id
			delete(c.ids, "<unk>")
		}
	}
	// Nor does text become BOS or EOS, whatever their type (a vocabulary
	// without types has them all normal).
	for _, id := range [...]int{t.BOS, t.EOS} {
		if id >= 0 && c.ids[t.Tokens[id]] == id {
			delete(c.ids, t.Tokens[id])
		}
	}
	// User-defined tokens are matched in the text before anything else,
	// and for EncodeSpecial also control and unknown ones (llama.cpp's
	// tokenizer_st_partition, which leaves control and unknown tokens out
	// unless asked to parse special tokens).
	strip := stripFlags(t)
	user, special := make(map[string]int), make(map[string]int)
	var long []string
	for id, s := range t.Tokens {
		typ := c.typ(id)
		// BOS, EOS and the unknown token never come from Encode's text.
		fromText := typ == tokenUserDefined && id != t.BOS && id != t.EOS && id != c.unk
		switch {
		case typ != tokenUserDefined && typ != tokenControl && typ != tokenUnknown || s == "":
		case len(s) > maxUserTokenBytes:
			if fromText {
				long = append(long, s)
			}
		default:
			special[s] = id // the last of duplicates, as ids
			if fromText {
				user[s] = id
			}
		}
	}
	c.user = newUserTokens(user, strip)
	c.special = newUserTokens(special, strip)
	if w := tooLongWarning(long); w != "" {
		c.warning = strings.TrimPrefix(c.warning+"; "+w, "; ")
	}
	if !c.spm {
		for b := range 256 {
			if id, ok := c.ids[byteToUnicode[b]]; ok {
				c.byteTok[b] = id
			}
		}
		c.ranks = make(map[pair]int, len(t.Merges))
		for i, m := range t.Merges {
			// As llama.cpp: the first space after the first byte separates
			// the two halves.
			k := -1
			if len(m) >= 3 {
				k = strings.IndexByte(m[1:], ' ') + 1
			}
			if k <= 0 || k == len(m)-1 {
				return nil, fmt.Errorf("tokenizer: merge %d (%q) is not two tokens separated by a space", i, m)
			}
			p := pair{m[:k], m[k+1:]}
			if _, dup := c.ranks[p]; !dup {
				c.ranks[p] = i
			}
		}
	}
	return c, nil
}

// stripFlags returns each token's strip flags, indexed by id, from the
// tokenizer's LStrip and RStrip; nil where both are empty. validate
// checked the ids.
func stripFlags(t *Tokenizer) []uint8 {
	if len(t.LStrip) == 0 && len(t.RStrip) == 0 {
		return nil
	}
	flags := make([]uint8, len(t.Tokens))
	for _, id := range t.LStrip {
		flags[id] |= stripLeft
	}
	for _, id := range t.RStrip {
		flags[id] |= stripRight
	}
	return flags
}

func (c *TokenCodec) typ(id int) int32 {
	if c.t.Types == nil {
		return tokenNormal
	}
	return c.t.Types[id]
}

// parseByteToken parses "<0xXX>" (upper- or lowercase hex digits).
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	var v byte
	for _, ch := range []byte(s[3:5]) {
		switch {
		case ch >= '0' && ch <= '9':
			v = v<<4 | (ch - '0')
		case ch >= 'A' && ch <= 'F':
			v = v<<4 | (ch - 'A' + 10)
		case ch >= 'a' && ch <= 'f':
			v = v<<4 | (ch - 'a' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

// Encode returns the tokens of text, BOS first and EOS last where the
// model adds them. Text of more than MaxPromptBytes is refused; invalid
// UTF-8 is encoded byte by byte (byte tokens, or the unknown token).
// Encode fails where a character has neither a token, byte tokens nor an
// unknown token.
func (c *TokenCodec) Encode(text string) ([]int, error) {
	return c.encode(text, true, false)
}

// EncodeSpecial is Encode for text that spells out the model's special
// tokens, as a chat template's text does ("<|user|>\nHi<|end|>\n"):
// besides the user-defined tokens, the text of a control or unknown
// token (BOS, EOS and the unknown token included) becomes that token,
// as llama.cpp's parse_special does. The whitespace next to a token that
// strips it is dropped as in Encode. Control and unknown tokens longer
// than maxUserTokenBytes are not looked for. Only for text the caller
// trusts to hold such tokens: a user's text given to it can end a turn
// or the generation.
func (c *TokenCodec) EncodeSpecial(text string) ([]int, error) {
	return c.encode(text, true, true)
}

// encode is Encode, with BOS and EOS only where addSpecial says so
// (llama.cpp's add_special; its tokenizer tests run without), and
// control and unknown tokens found in the text where parseSpecial says
// so (llama.cpp's parse_special).
func (c *TokenCodec) encode(text string, addSpecial, parseSpecial bool) ([]int, error) {
	if len(text) > MaxPromptBytes {
		return nil, fmt.Errorf("%w: %d bytes (the limit is %d)", ErrPromptTooLong, len(text), MaxPromptBytes)
	}
	var out []int
	if addSpecial && c.addBOS {
		out = append(out, c.t.BOS)
	}
	first := c.user
	if parseSpecial {
		first = c.special
	}
	var err error
	switch {
	case text == "":
	case first != nil:
		err = first.cut(text, func(raw string) (err error) {
			out, err = c.encodeText(out, raw)
			return err
		}, func(id int) { out = append(out, id) })
	default:
		out, err = c.encodeText(out, text)
	}
	if err != nil {
		return nil, err
	}
	if addSpecial && c.addEOS {
		out = append(out, c.t.EOS)
	}
	return out, nil
}

// encodeText encodes text that holds no user-defined token. For llama
// models it gets the "▁" prefix (unless add_space_prefix is false): as
// llama.cpp, each stretch of text between user-defined tokens does (the
// stretch that strip flags leave, and none where they leave nothing).
func (c *TokenCodec) encodeText(out []int, text string) ([]int, error) {
	if c.spm {
		if c.spacePrefix {
			text = " " + text
		}
		return c.encodeSPM(out, strings.ReplaceAll(text, " ", spmSpace))
	}
	if c.nfc {
		// After the user-defined tokens are found, as Hugging Face
		// normalizes only the text between added tokens. NFC can lengthen
		// text by a small constant factor at most.
		text = norm.NFC.String(text)
	}
	var err error
	var buf []byte
	c.split(text, func(word string) bool {
		buf = buf[:0]
		for i := 0; i < len(word); i++ {
			buf = append(buf, byteToUnicode[word[i]]...)
		}
		if c.ignoreMerges {
			if id, ok := c.ids[string(buf)]; ok {
				out = append(out, id)
				return true
			}
		}
		out, err = c.encodeBPE(out, string(buf))
		return err == nil
	})
	return out, err
}

// Warning says how the codec departs from the model's own tokenizer (a
// pre-tokenizer it does not know, split as GPT-2 splits; user-defined
// tokens too long to look for in the text), or is empty.
// The caller prints it; the codec says it nowhere else.
func (c *TokenCodec) Warning() string { return c.warning }

// symbol is a piece of the text being merged: text[start:end], in a
// list of the pieces not merged away (end == start).
type symbol struct {
	start, end int
	prev, next int // -1 at the ends
}

// bigram is a candidate merge of symbols left and right. score orders
// them (highest first, then leftmost); size is the merged length when it
// was queued (a merge since then makes it stale).
type bigram struct {
	left, right int
	score       float64
	size        int
}

type bigramQueue []bigram

func (q bigramQueue) Len() int { return len(q) }
func (q bigramQueue) Less(i, j int) bool {
	if q[i].score != q[j].score {
		return q[i].score > q[j].score
	}
	return q[i].left < q[j].left
}
func (q bigramQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *bigramQueue) Push(x any)   { *q = append(*q, x.(bigram)) }
func (q *bigramQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// merge runs the merges of text's symbols (its UTF-8 characters, an
// invalid byte alone) that score() allows (ok false: not a merge) and
// returns the symbols left.
func merge(text string, score func(a, b string) (float64, bool)) []symbol {
	if text == "" {
		return nil
	}
	syms := make([]symbol, 0, len(text))
	for i := 0; i < len(text); {
		_, n := utf8.DecodeRuneInString(text[i:])
		syms = append(syms, symbol{start: i, end: i + n, prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	syms[len(syms)-1].next = -1
	q := make(bigramQueue, 0, len(syms))
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		a, b := text[syms[l].start:syms[l].end], text[syms[r].start:syms[r].end]
		if s, ok := score(a, b); ok {
			heap.Push(&q, bigram{left: l, right: r, score: s, size: len(a) + len(b)})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		bg := heap.Pop(&q).(bigram)
		l, r := &syms[bg.left], &syms[bg.right]
		if l.end == l.start || r.end == r.start || l.next != bg.right || (l.end-l.start)+(r.end-r.start) != bg.size {
			continue // stale
		}
		l.end = r.end
		r.start = r.end
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = bg.left
		}
		try(l.prev, bg.left)
		try(bg.left, l.next)
	}
	out := syms[:0]
	for i := 0; i >= 0; i = syms[i].next {
		out = append(out, syms[i]) // i >= len(out): no symbol is overwritten before it is read
	}
	return out
}

func (c *TokenCodec) encodeSPM(out []int, text string) ([]int, error) {
	score := func(a, b string) (float64, bool) {
		id, ok := c.ids[a+b]
		if !ok {
			return 0, false
		}
		if c.t.Scores == nil {
			return 0, true
		}
		return float64(c.t.Scores[id]), true
	}
	for _, s := range merge(text, score) {
		piece := text[s.start:s.end]
		if id, ok := c.ids[piece]; ok {
			out = append(out, id)
			continue
		}
		var err error
		if out, err = c.fallback(out, piece, []byte(piece)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fallback encodes a piece that is no token as byte tokens, or else as
// the unknown token.
func (c *TokenCodec) fallback(out []int, piece string, bytes []byte) ([]int, error) {
	all := true
	for _, b := range bytes {
		all = all && c.byteTok[b] >= 0
	}
	switch {
	case all:
		for _, b := range bytes {
			out = append(out, c.byteTok[b])
		}
	case c.unk >= 0:
		out = append(out, c.unk)
	default:
		return nil, fmt.Errorf("tokenizer: %q has no token, no byte tokens and the vocabulary no unknown token", piece)
	}
	return out, nil
}

// encodeBPE encodes one pre-tokenized piece, its bytes already mapped to
// GPT-2's characters.
func (c *TokenCodec) encodeBPE(out []int, word string) ([]int, error) {
	score := func(a, b string) (float64, bool) {
		r, ok := c.ranks[pair{a, b}]
		return -float64(r), ok
	}
	for _, s := range merge(word, score) {
		piece := word[s.start:s.end]
		if id, ok := c.ids[piece]; ok {
			out = append(out, id)
			continue
		}
		// A merge whose result is no token: its bytes one by one.
		var bytes []byte
		for _, r := range piece {
			bytes = append(bytes, unicodeToByte[r])
		}
		var err error
		if out, err = c.fallback(out, string(bytes), bytes); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// byteToUnicode is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others for the code points from 256 on, in order.
var byteToUnicode, unicodeToByte = func() ([256]string, map[rune]byte) {
	var fwd [256]string
	rev := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		fwd[b] = string(r)
		rev[r] = byte(b)
	}
	return fwd, rev
}()

// Decode returns the text of tokens: control tokens are left out, the
// unknown token (and an id outside the vocabulary) is U+FFFD, and for
// llama models the space that Encode put in front (add_space_prefix) is
// taken off. For
// text without "▁" that the vocabulary covers, Decode(Encode(s)) == s,
// except, for llama models, after a user-defined token (Encode puts a
// space in front of the text that follows it, as llama.cpp does), and
// for the whitespace that Encode dropped next to a token that strips it.
func (c *TokenCodec) Decode(ids []int) string {
	d := c.NewDecoder()
	d.strip = c.spacePrefix
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Next(id))
	}
	b.WriteString(d.Flush())
	return b.String()
}

// piece appends the bytes of one token.
func (c *TokenCodec) piece(dst []byte, id int) (out []byte, fromByte bool) {
	if id < 0 || id >= len(c.t.Tokens) {
		return append(dst, "\uFFFD"...), false
	}
	s := c.t.Tokens[id]
	switch c.typ(id) {
	case tokenControl:
		return dst, false
	case tokenUnknown:
		return append(dst, "\uFFFD"...), false
	case tokenUserDefined:
		return append(dst, s...), false
	}
	if c.spm {
		if b := c.byteVal[id]; b >= 0 {
			return append(dst, byte(b)), true
		}
		return append(dst, strings.ReplaceAll(s, spmSpace, " ")...), false
	}
	for _, r := range s {
		if b, ok := unicodeToByte[r]; ok {
			dst = append(dst, b)
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst, false
}

// NewDecoder returns a streaming decoder of generated tokens (a
// continuation: a llama model's leading space is kept).
func (c *TokenCodec) NewDecoder() *TokenDecoder { return &TokenDecoder{c: c} }

// TokenDecoder turns tokens into text one at a time. A token may end
// inside a UTF-8 character (byte tokens carry one byte each): the
// incomplete character is held back until the tokens that complete it
// come, or until Flush. The concatenation of what Next and Flush return
// is exactly the bytes of the tokens.
type TokenDecoder struct {
	c       *TokenCodec
	pending []byte
	strip   bool // take off a leading space (Decode of llama text)
}

// Next returns the text that token completes.
func (d *TokenDecoder) Next(id int) string {
	n := len(d.pending)
	var fromByte bool
	d.pending, fromByte = d.c.piece(d.pending, id)
	if d.strip && len(d.pending) > n {
		if !fromByte && d.pending[n] == ' ' {
			d.pending = append(d.pending[:n], d.pending[n+1:]...)
		}
		d.strip = false
	}
	// Hold back the last character if it is a valid but unfinished
	// UTF-8 sequence.
	cut := len(d.pending)
	for k := len(d.pending) - 1; k >= 0 && k >= len(d.pending)-(utf8.UTFMax-1); k-- {
		if d.pending[k]&0xC0 != 0x80 { // the last sequence's first byte
			if !utf8.FullRune(d.pending[k:]) {
				cut = k
			}
			break
		}
	}
	out := string(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

// Flush returns what is held back (an unfinished UTF-8 sequence, as it is).
func (d *TokenDecoder) Flush() string {
	out := string(d.pending)
	d.pending = d.pending[:0]
	return out
}
