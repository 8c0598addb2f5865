package experts

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// maxUserTokenBytes bounds the user-defined tokens that are matched in
// the raw text: finding the longest token at a position may read that
// many bytes of the text, so a prompt costs at most MaxPromptBytes times
// this. The longest user-defined token of the vocabularies checked
// (gpt-neox's runs of spaces) has 24 bytes; a longer one is not looked
// for (a llama model's merges may still reach it), and the codec's
// Warning says so.
const maxUserTokenBytes = 128

// userTokens finds a vocabulary's user-defined tokens (for
// EncodeSpecial also its control and unknown tokens) in text, as
// llama.cpp and Hugging Face's tokenizers do before the pre-tokenizer
// runs: where one starts, the longest one there becomes that token, and
// the text between such tokens is encoded as usual, less the whitespace
// that a token's strip flags drop next to it.
//
// The tokens are kept sorted by their text: the tokens that start with a
// prefix are a range of them, narrowed byte by byte with binary searches,
// so the table costs one index per token whatever their lengths.
type userTokens struct {
	text []string // sorted, distinct, none empty
	id   []int    // id[i] is text[i]'s token
	// strip[i] is text[i]'s stripLeft and stripRight flags; nil for none.
	strip []uint8
	// first[b] is the range of text whose first byte is b.
	first [256]struct{ lo, hi int32 }
}

// Strip flags of a token found in the text (llama.cpp's token
// attributes LSTRIP and RSTRIP): the whitespace before it, or after it,
// is dropped.
const (
	stripLeft uint8 = 1 << iota
	stripRight
)

// newUserTokens makes the table of the tokens in ids (text to token).
// Where two tokens have the same text, ids holds the one that text
// becomes. strip holds each token's strip flags, indexed by id (nil:
// none strips).
func newUserTokens(ids map[string]int, strip []uint8) *userTokens {
	if len(ids) == 0 {
		return nil
	}
	u := &userTokens{}
	for s := range ids {
		u.text = append(u.text, s)
	}
	slices.Sort(u.text)
	u.id = make([]int, len(u.text))
	for i, s := range u.text {
		u.id[i] = ids[s]
		if strip != nil && strip[u.id[i]] != 0 {
			if u.strip == nil {
				u.strip = make([]uint8, len(u.text))
			}
			u.strip[i] = strip[u.id[i]]
		}
		b := s[0]
		if u.first[b].hi == 0 {
			u.first[b].lo = int32(i)
		}
		u.first[b].hi = int32(i) + 1
	}
	return u
}

// longest returns the index in text of the longest token that s starts
// with, and its length in bytes; n is 0 for none. It reads at most the
// longest token's length of s.
func (u *userTokens) longest(s string) (k, n int) {
	r := u.first[s[0]]
	lo, hi := int(r.lo), int(r.hi)
	for d := 1; lo < hi; {
		// text[lo:hi] are the tokens that start with s[:d]; one that is
		// s[:d] itself sorts first.
		if len(u.text[lo]) == d {
			k, n = lo, d
			lo++
		}
		if d == len(s) || lo == hi {
			break
		}
		// The tokens left share their first l bytes, and none ends before
		// l (it would sort first and bound l): compare them at once.
		first, last := u.text[lo], u.text[hi-1]
		l := d
		for l < len(first) && l < len(last) && first[l] == last[l] {
			l++
		}
		if l > d {
			if !strings.HasPrefix(s[d:], first[d:l]) {
				break
			}
			d = l
			continue
		}
		// They differ at byte d: keep those whose byte d is s's.
		b, cand := s[d], u.text[lo:hi]
		from := sort.Search(len(cand), func(k int) bool { return cand[k][d] >= b })
		to := from + sort.Search(len(cand)-from, func(k int) bool { return cand[from+k][d] > b })
		lo, hi = lo+from, lo+to
		d++
	}
	return k, n
}

// cut calls raw with each stretch of text between the table's tokens
// and token with each such token, in order: from each position the
// longest token that starts there, the leftmost first (Hugging Face's
// added-token split). llama.cpp takes the longer tokens first wherever
// they are in the text; the two differ only where two tokens overlap in
// the text. A token with stripLeft takes the ASCII whitespace at the end
// of the stretch before it off, one with stripRight the whitespace that
// follows it (llama.cpp's tokenizer_st_partition, which trims the
// fragments of raw text next to such a token); a stretch left empty is
// not passed on. It stops at the first error.
func (u *userTokens) cut(text string, raw func(string) error, token func(int)) error {
	start := 0 // text[start:i] is raw text not yet passed on
	for i := 0; i < len(text); {
		k, n := u.longest(text[i:])
		if n == 0 {
			i++
			continue
		}
		var strip uint8
		if u.strip != nil {
			strip = u.strip[k]
		}
		end := i
		if strip&stripLeft != 0 {
			for end > start && isCSpace(text[end-1]) {
				end--
			}
		}
		if start < end {
			if err := raw(text[start:end]); err != nil {
				return err
			}
		}
		token(u.id[k])
		i += n
		if strip&stripRight != 0 {
			for i < len(text) && isCSpace(text[i]) {
				i++
			}
		}
		start = i
	}
	if start < len(text) {
		return raw(text[start:])
	}
	return nil
}

// isCSpace reports whether b is whitespace to C's isspace in the C
// locale, as llama.cpp strips: space, \t, \n, \v, \f or \r (Hugging
// Face's lstrip and rstrip also strip Unicode spaces).
func isCSpace(b byte) bool {
	return b == ' ' || b >= '\t' && b <= '\r'
}

// tooLongWarning is the codec's Warning for user-defined tokens too long
// to be matched in the text; empty for none.
func tooLongWarning(long []string) string {
	if len(long) == 0 {
		return ""
	}
	slices.Sort(long)
	return fmt.Sprintf("tokenizer: %d user-defined tokens (the first: %q) are longer than %d bytes and are not looked for in the text",
		len(long), long[0], maxUserTokenBytes)
}
