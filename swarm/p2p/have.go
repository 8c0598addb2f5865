package p2p

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
)

// HaveTopicPrefix starts the name of a swarm's have-announcement topic:
// /rdrr/have/<swarm name>.
const HaveTopicPrefix = "/rdrr/have/"

// MaxHaveCIDs bounds the CIDs of one have-announcement; a peer that
// serves more announces them in several messages.
const MaxHaveCIDs = 1024

const (
	haveVersion     = 1
	haveEntry       = 1 + 32 // kind, digest
	haveKindRaw     = 0
	haveKindCollect = 1
	// MaxHaveBytes is the largest valid encoded announcement.
	MaxHaveBytes = 1 + 2 + MaxHaveCIDs*haveEntry // version, count (2-byte uvarint), entries
)

// HaveTopic returns the have-announcement topic of a swarm. The swarm
// name follows the signaling topic rules (1..256 bytes of UTF-8 without
// control characters).
func HaveTopic(swarmName string) (string, error) {
	if err := signaling.CheckTopic(swarmName); err != nil {
		return "", fmt.Errorf("p2p: swarm name: %w", err)
	}
	return HaveTopicPrefix + swarmName, nil
}

// HaveAnnouncement says which blobs a peer serves in whole. Encoded
// (PROTOCOL.md): a version byte (1), the count as a canonical unsigned
// varint (1..MaxHaveCIDs), then per CID a kind byte (0 raw, 1 collection)
// and its 32-byte BLAKE3 digest. No digest appears twice and nothing
// follows the last entry.
type HaveAnnouncement struct {
	CIDs []cas.CID
}

// MarshalBinary encodes a.
func (a HaveAnnouncement) MarshalBinary() ([]byte, error) {
	if len(a.CIDs) == 0 || len(a.CIDs) > MaxHaveCIDs {
		return nil, fmt.Errorf("%w: %d CIDs; want 1..%d", ErrBadHave, len(a.CIDs), MaxHaveCIDs)
	}
	seen := make(map[cas.Digest]struct{}, len(a.CIDs))
	b := make([]byte, 0, 3+len(a.CIDs)*haveEntry)
	b = append(b, haveVersion)
	b = binary.AppendUvarint(b, uint64(len(a.CIDs)))
	for _, c := range a.CIDs {
		if _, dup := seen[c.Digest()]; dup {
			return nil, fmt.Errorf("%w: %s twice", ErrBadHave, c)
		}
		seen[c.Digest()] = struct{}{}
		kind := byte(haveKindRaw)
		if c.IsCollection() {
			kind = haveKindCollect
		}
		b = append(b, kind)
		b = c.AppendDigest(b)
	}
	return b, nil
}

// UnmarshalBinary decodes b strictly: anything but the canonical encoding
// of a valid announcement is an error wrapping ErrBadHave.
func (a *HaveAnnouncement) UnmarshalBinary(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadHave}, args...)...)
	}
	if len(b) > MaxHaveBytes {
		return bad("%d bytes; at most %d", len(b), MaxHaveBytes)
	}
	if len(b) < 1 || b[0] != haveVersion {
		return bad("version missing or not %d", haveVersion)
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 {
		return bad("count is not a varint")
	}
	if k != len(binary.AppendUvarint(nil, n)) {
		return bad("count is not a canonical varint")
	}
	if n == 0 || n > MaxHaveCIDs {
		return bad("%d CIDs; want 1..%d", n, MaxHaveCIDs)
	}
	rest := b[1+k:]
	if uint64(len(rest)) != n*haveEntry {
		return bad("%d bytes of entries for %d CIDs; want %d", len(rest), n, n*haveEntry)
	}
	cids := make([]cas.CID, 0, n)
	seen := make(map[cas.Digest]struct{}, n)
	for i := range int(n) {
		e := rest[i*haveEntry : (i+1)*haveEntry]
		d := cas.Digest(e[1:])
		if _, dup := seen[d]; dup {
			return bad("entry %d repeats a digest", i)
		}
		seen[d] = struct{}{}
		switch e[0] {
		case haveKindRaw:
			cids = append(cids, cas.RawCID(d))
		case haveKindCollect:
			cids = append(cids, cas.CollectionCID(d))
		default:
			return bad("entry %d has kind %d", i, e[0])
		}
	}
	a.CIDs = cids
	return nil
}

// validHave is the have topic's validator.
func validHave(_ peer.ID, data []byte) error {
	var a HaveAnnouncement
	return a.UnmarshalBinary(data)
}

// Haves is a swarm's joined have-announcement topic.
type Haves struct {
	*Topic
}

// JoinHaves joins the have-announcement topic of swarmName.
func (g *Gossip) JoinHaves(swarmName string) (*Haves, error) {
	name, err := HaveTopic(swarmName)
	if err != nil {
		return nil, err
	}
	t, err := g.JoinValidatedTopic(name, MaxHaveBytes, validHave)
	if err != nil {
		return nil, err
	}
	return &Haves{Topic: t}, nil
}

// Announce publishes that this peer serves cids, in messages of at most
// MaxHaveCIDs each.
func (h *Haves) Announce(ctx context.Context, cids []cas.CID) error {
	for len(cids) > 0 {
		n := min(len(cids), MaxHaveCIDs)
		b, err := HaveAnnouncement{CIDs: cids[:n]}.MarshalBinary()
		if err != nil {
			return err
		}
		if err := h.Publish(ctx, b); err != nil {
			return err
		}
		cids = cids[n:]
	}
	return nil
}

// NextHave returns the next announcement from another peer (validated:
// it decodes).
func (h *Haves) NextHave(ctx context.Context) (peer.ID, HaveAnnouncement, error) {
	m, err := h.Next(ctx)
	if err != nil {
		return "", HaveAnnouncement{}, err
	}
	var a HaveAnnouncement
	if err := a.UnmarshalBinary(m.Data); err != nil {
		return "", HaveAnnouncement{}, err // the validator let it through: a bug
	}
	return m.From, a, nil
}
