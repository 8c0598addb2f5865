// Package wire encodes and decodes the frames peers exchange over WebRTC
// data channels (swarm/PROTOCOL.md is the specification). It owns the byte
// layout only: no I/O, no state, no policy. Decoding is strict and
// canonical (every accepted frame re-encodes to the same bytes), allocates
// nothing for the hot frames (PIECE, REQUEST), and never trusts a length it
// has not checked against the frame.
package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/rdrr/peer/cas"
)

// Version is the protocol version this package speaks.
const Version = 1

const (
	// MaxFrame is the largest frame, length prefix included: 64 KiB, which
	// every browser's data channel accepts.
	MaxFrame = 64 << 10
	// MinFrame is the smallest max_frame a peer may announce.
	MinFrame = 4 << 10
	// HeaderSize is the length prefix and the type byte.
	HeaderSize = 5
	// PieceHeaderSize is a PIECE frame's fixed part; the data follows.
	PieceHeaderSize = HeaderSize + 8
	// MaxPieceData is the most slice bytes one PIECE of MaxFrame carries.
	MaxPieceData = MaxFrame - PieceHeaderSize
	// MinPieceData is the least slice bytes a PIECE carries unless it
	// ends its request's slice (PROTOCOL.md, PIECE): it bounds the frames
	// a receiver handles per request.
	MinPieceData = 1024
	// MaxReason bounds a REJECT's reason text.
	MaxReason = 255
	// MaxAgent bounds a HELLO's agent string.
	MaxAgent = 64
	// MaxRequest is the largest range one REQUEST may ask for (a peer
	// announces its own limit, at most this).
	MaxRequest = 4 << 20
	// PieceUnit is the granularity of HAVE bitmaps: bit i covers bytes
	// [i*PieceUnit, (i+1)*PieceUnit) of the blob.
	PieceUnit = 1 << 20
)

// Type is a frame type.
type Type uint8

// Frame types.
const (
	TypeHello   Type = 1
	TypeHave    Type = 2
	TypeWant    Type = 3
	TypeRequest Type = 4
	TypePiece   Type = 5
	TypeCancel  Type = 6
	TypeReject  Type = 7
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "HELLO"
	case TypeHave:
		return "HAVE"
	case TypeWant:
		return "WANT"
	case TypeRequest:
		return "REQUEST"
	case TypePiece:
		return "PIECE"
	case TypeCancel:
		return "CANCEL"
	case TypeReject:
		return "REJECT"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Caps are capability bits announced in HELLO. Unknown bits are kept and
// ignored.
type Caps uint32

const (
	// CapServe: the sender answers WANT and REQUEST.
	CapServe Caps = 1 << 0
	// CapBigMTU: the sender reads datagrams larger than the WebRTC
	// default on this connection (it announced caps.recv_mtu; native
	// peers on loopback or a LAN that carries them).
	CapBigMTU Caps = 1 << 1
	// CapPartial: the sender takes HAVE entries with bitmaps (blobs held
	// in part) in answers to its WANTs and in announcements (req 0), and
	// announces its own pieces as they complete (PROTOCOL.md, HAVE).
	CapPartial Caps = 1 << 2
)

// Code is a REJECT reason code.
type Code uint16

// Request-level codes (REJECT with the request's id).
const (
	CodeNotFound     Code = 1 // the blob is not stored here
	CodeBadRequest   Code = 2 // range out of bounds, unaligned, or too long
	CodeBusy         Code = 3 // too many outstanding requests: retry later
	CodeCorrupt      Code = 4 // the server's own copy failed verification
	CodeShuttingDown Code = 5
	CodeInternal     Code = 6
)

// Connection-level codes (REJECT with id 0); the sender closes after it.
const (
	CodeProtocol      Code = 16 // a frame out of place (before HELLO, on the wrong channel, ...)
	CodeMalformed     Code = 17 // a frame that does not decode
	CodeFrameTooLarge Code = 18 // a frame larger than max_frame
	CodeVersion       Code = 19 // no common protocol version
	CodeBadData       Code = 20 // the sender's data failed verification; it is banned
	CodeGoingAway     Code = 21 // normal close
	CodeTimeout       Code = 22 // no HELLO, or no progress, in time
)

func (c Code) String() string {
	switch c {
	case CodeNotFound:
		return "not_found"
	case CodeBadRequest:
		return "bad_request"
	case CodeBusy:
		return "busy"
	case CodeCorrupt:
		return "corrupt"
	case CodeShuttingDown:
		return "shutting_down"
	case CodeInternal:
		return "internal"
	case CodeProtocol:
		return "protocol"
	case CodeMalformed:
		return "malformed"
	case CodeFrameTooLarge:
		return "frame_too_large"
	case CodeVersion:
		return "version"
	case CodeBadData:
		return "bad_data"
	case CodeGoingAway:
		return "going_away"
	case CodeTimeout:
		return "timeout"
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Hello opens a connection in each direction.
type Hello struct {
	Version        uint16
	Caps           Caps
	MaxFrame       uint32 // largest frame the sender accepts (MinFrame..MaxFrame)
	MaxRequest     uint32 // largest REQUEST length the sender serves (GroupSize..MaxRequest)
	MaxOutstanding uint16 // REQUESTs the sender queues per connection before answering busy (>= 1)
	Agent          string // free text, at most MaxAgent bytes of UTF-8
}

// HaveEntry says a blob is held: wholly, or (Bitmap != nil) the PieceUnit
// pieces whose bits are set.
type HaveEntry struct {
	CID    cas.CID
	Size   uint64
	Bitmap []byte // nil: complete; else exactly BitmapLen(Size) bytes
}

// BitmapLen is the length of a HAVE bitmap for a blob of size bytes.
func BitmapLen(size uint64) int {
	pieces := (size + PieceUnit - 1) / PieceUnit
	return int((pieces + 7) / 8)
}

// Frame is any decoded frame; Type says which fields are meaningful.
// Decode reuses the slices of a Frame passed to it again.
type Frame struct {
	Type Type
	Req  uint32 // HAVE, WANT, REQUEST, PIECE, CANCEL, REJECT

	Hello Hello       // HELLO
	Have  []HaveEntry // HAVE
	Want  []cas.CID   // WANT

	CID cas.CID // REQUEST
	Off uint64  // REQUEST
	Len uint32  // REQUEST

	Pos  uint32 // PIECE: offset of Data in the request's slice encoding
	Data []byte // PIECE: aliases the decoded buffer

	Code   Code   // REJECT
	Reason string // REJECT
}

const (
	// HaveEntrySize is the encoded size of a HAVE entry without a bitmap
	// (a whole blob): cid, size, flags.
	HaveEntrySize  = 32 + 8 + 1
	haveEntryFixed = HaveEntrySize
	flagBitmap     = 1
	listHeader     = HeaderSize + 4 + 2 // req, count
	// MaxWant is the most CIDs one WANT carries: as many as the answering
	// HAVE (whole blobs only, HaveEntrySize each) can list in one
	// MaxFrame-byte frame, so that an answer always fits in one frame.
	MaxWant = (MaxFrame - listHeader) / HaveEntrySize
)

// WantLimit is the most CIDs one WANT may carry between a server that
// accepts frames of serverMaxFrame bytes and a requester that accepts
// requesterMaxFrame: the WANT must fit the server's frame and the HAVE
// that answers it the requester's (PROTOCOL.md, WANT).
func WantLimit(serverMaxFrame, requesterMaxFrame int) int {
	return max(0, min(MaxWant, (serverMaxFrame-listHeader)/32, (requesterMaxFrame-listHeader)/HaveEntrySize))
}

// Error says why a frame did not decode.
type Error struct {
	Type   Type
	Reason string
}

func (e *Error) Error() string {
	if e.Type == 0 {
		return "wire: " + e.Reason
	}
	return fmt.Sprintf("wire: %v: %s", e.Type, e.Reason)
}

func errf(t Type, format string, args ...any) error {
	return &Error{Type: t, Reason: fmt.Sprintf(format, args...)}
}

var be = binary.BigEndian

// Decode parses one whole frame (as one data channel message carries it)
// into f. maxFrame is the receiver's limit. f.Data and f.Have[i].Bitmap
// alias b.
func Decode(b []byte, maxFrame int, f *Frame) error {
	if len(b) > maxFrame {
		return &TooLargeError{Len: len(b), Max: maxFrame}
	}
	if len(b) < HeaderSize {
		return errf(0, "frame of %d bytes is shorter than its header", len(b))
	}
	if n := be.Uint32(b); int64(n) != int64(len(b)-4) {
		return errf(0, "length prefix %d; frame has %d bytes after it", n, len(b)-4)
	}
	t := Type(b[4])
	p := b[HeaderSize:]
	*f = Frame{Type: t, Have: f.Have[:0], Want: f.Want[:0]}
	need := func(n int) error {
		if len(p) != n {
			return errf(t, "body is %d bytes; want %d", len(p), n)
		}
		return nil
	}
	switch t {
	case TypeHello:
		if len(p) < 17 {
			return errf(t, "body is %d bytes; want at least 17", len(p))
		}
		h := &f.Hello
		h.Version = be.Uint16(p)
		h.Caps = Caps(be.Uint32(p[2:]))
		h.MaxFrame = be.Uint32(p[6:])
		h.MaxRequest = be.Uint32(p[10:])
		h.MaxOutstanding = be.Uint16(p[14:])
		alen := int(p[16])
		if err := need(17 + alen); err != nil {
			return err
		}
		h.Agent = string(p[17:])
		return h.check()
	case TypeHave:
		if len(p) < 6 {
			return errf(t, "body is %d bytes; want at least 6", len(p))
		}
		f.Req = be.Uint32(p)
		n := int(be.Uint16(p[4:]))
		p = p[6:]
		for i := 0; i < n; i++ {
			if len(p) < haveEntryFixed {
				return errf(t, "entry %d truncated", i)
			}
			var e HaveEntry
			e.CID = cas.RawCID(cas.Digest(p))
			e.Size = be.Uint64(p[32:])
			flags := p[40]
			p = p[haveEntryFixed:]
			switch flags {
			case 0:
			case flagBitmap:
				bl := BitmapLen(e.Size)
				if len(p) < bl {
					return errf(t, "entry %d: bitmap truncated", i)
				}
				e.Bitmap = p[:bl:bl]
				p = p[bl:]
				if err := checkBitmapTail(e.Bitmap, e.Size); err != nil {
					return errf(t, "entry %d: %v", i, err)
				}
			default:
				return errf(t, "entry %d: unknown flags %#x", i, flags)
			}
			f.Have = append(f.Have, e)
		}
		if len(p) != 0 {
			return errf(t, "%d bytes after the last entry", len(p))
		}
		return nil
	case TypeWant:
		if len(p) < 6 {
			return errf(t, "body is %d bytes; want at least 6", len(p))
		}
		f.Req = be.Uint32(p)
		n := int(be.Uint16(p[4:]))
		if n == 0 || n > MaxWant {
			return errf(t, "%d CIDs; want 1..%d", n, MaxWant)
		}
		if err := need(6 + 32*n); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			f.Want = append(f.Want, cas.RawCID(cas.Digest(p[6+32*i:])))
		}
		return nil
	case TypeRequest:
		if err := need(4 + 32 + 8 + 4); err != nil {
			return err
		}
		f.Req = be.Uint32(p)
		f.CID = cas.RawCID(cas.Digest(p[4:]))
		f.Off = be.Uint64(p[36:])
		f.Len = be.Uint32(p[44:])
		// Offset and length are checked against the blob and the
		// server's max_request by the server, which answers REJECT
		// bad_request: they are not malformed.
		return nil
	case TypePiece:
		if len(p) < 8 {
			return errf(t, "body is %d bytes; want at least 8", len(p))
		}
		f.Req = be.Uint32(p)
		f.Pos = be.Uint32(p[4:])
		f.Data = p[8:]
		if len(f.Data) == 0 {
			return errf(t, "no data")
		}
		return nil
	case TypeCancel:
		if err := need(4); err != nil {
			return err
		}
		f.Req = be.Uint32(p)
		return nil
	case TypeReject:
		if len(p) < 7 {
			return errf(t, "body is %d bytes; want at least 7", len(p))
		}
		f.Req = be.Uint32(p)
		f.Code = Code(be.Uint16(p[4:]))
		if err := need(7 + int(p[6])); err != nil {
			return err
		}
		f.Reason = string(p[7:])
		if !utf8.ValidString(f.Reason) {
			return errf(t, "reason is not UTF-8")
		}
		return nil
	}
	return errf(t, "unknown frame type")
}

// checkBitmapTail rejects set bits past the blob's last piece (so that the
// encoding is canonical).
func checkBitmapTail(bm []byte, size uint64) error {
	pieces := (size + PieceUnit - 1) / PieceUnit
	for i := pieces; i < uint64(len(bm))*8; i++ {
		if bm[i/8]&(1<<(i%8)) != 0 {
			return fmt.Errorf("bit %d set past the last piece", i)
		}
	}
	return nil
}

func (h *Hello) check() error {
	switch {
	case h.Version == 0:
		return errf(TypeHello, "version 0")
	case h.MaxFrame < MinFrame || h.MaxFrame > MaxFrame:
		return errf(TypeHello, "max_frame %d; want %d..%d", h.MaxFrame, MinFrame, MaxFrame)
	case h.MaxRequest < cas.GroupSize || h.MaxRequest > MaxRequest:
		return errf(TypeHello, "max_request %d; want %d..%d", h.MaxRequest, cas.GroupSize, MaxRequest)
	case h.MaxOutstanding == 0:
		return errf(TypeHello, "max_outstanding 0")
	case len(h.Agent) > MaxAgent || !utf8.ValidString(h.Agent):
		return errf(TypeHello, "agent must be at most %d bytes of UTF-8", MaxAgent)
	}
	return nil
}

// TooLargeError is a frame longer than the receiver accepts.
type TooLargeError struct{ Len, Max int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("wire: frame of %d bytes exceeds max_frame %d", e.Len, e.Max)
}

func header(dst []byte, t Type, body int) []byte {
	dst = be.AppendUint32(dst, uint32(1+body))
	return append(dst, byte(t))
}

// AppendHello appends a HELLO frame. h must satisfy the bounds that Decode
// checks; AppendHello truncates a long agent.
func AppendHello(dst []byte, h Hello) []byte {
	agent := h.Agent
	if len(agent) > MaxAgent {
		agent = agent[:MaxAgent]
	}
	dst = header(dst, TypeHello, 17+len(agent))
	dst = be.AppendUint16(dst, h.Version)
	dst = be.AppendUint32(dst, uint32(h.Caps))
	dst = be.AppendUint32(dst, h.MaxFrame)
	dst = be.AppendUint32(dst, h.MaxRequest)
	dst = be.AppendUint16(dst, h.MaxOutstanding)
	dst = append(dst, byte(len(agent)))
	return append(dst, agent...)
}

// AppendHave appends a HAVE frame. The caller keeps it under MaxFrame
// (HaveLen tells the size).
func AppendHave(dst []byte, req uint32, entries []HaveEntry) []byte {
	dst = header(dst, TypeHave, HaveLen(entries)-HeaderSize)
	dst = be.AppendUint32(dst, req)
	dst = be.AppendUint16(dst, uint16(len(entries)))
	for _, e := range entries {
		dst = e.CID.AppendDigest(dst)
		dst = be.AppendUint64(dst, e.Size)
		if e.Bitmap == nil {
			dst = append(dst, 0)
			continue
		}
		dst = append(dst, flagBitmap)
		dst = append(dst, e.Bitmap...)
	}
	return dst
}

// HaveLen is the encoded size of a HAVE frame with entries.
func HaveLen(entries []HaveEntry) int {
	n := HeaderSize + 6
	for _, e := range entries {
		n += haveEntryFixed + len(e.Bitmap)
	}
	return n
}

// AppendWant appends a WANT frame for 1..MaxWant CIDs.
func AppendWant(dst []byte, req uint32, cids []cas.CID) []byte {
	dst = header(dst, TypeWant, 6+32*len(cids))
	dst = be.AppendUint32(dst, req)
	dst = be.AppendUint16(dst, uint16(len(cids)))
	for _, c := range cids {
		dst = c.AppendDigest(dst)
	}
	return dst
}

// AppendRequest appends a REQUEST frame.
func AppendRequest(dst []byte, req uint32, c cas.CID, off uint64, n uint32) []byte {
	dst = header(dst, TypeRequest, 48)
	dst = be.AppendUint32(dst, req)
	dst = c.AppendDigest(dst)
	dst = be.AppendUint64(dst, off)
	return be.AppendUint32(dst, n)
}

// PutPieceHeader writes a PIECE header for n data bytes into
// b[:PieceHeaderSize], so that a sender can build frames in place.
func PutPieceHeader(b []byte, req, pos uint32, n int) {
	be.PutUint32(b, uint32(1+8+n))
	b[4] = byte(TypePiece)
	be.PutUint32(b[5:], req)
	be.PutUint32(b[9:], pos)
}

// AppendPiece appends a PIECE frame.
func AppendPiece(dst []byte, req, pos uint32, data []byte) []byte {
	var h [PieceHeaderSize]byte
	PutPieceHeader(h[:], req, pos, len(data))
	return append(append(dst, h[:]...), data...)
}

// AppendCancel appends a CANCEL frame.
func AppendCancel(dst []byte, req uint32) []byte {
	return be.AppendUint32(header(dst, TypeCancel, 4), req)
}

// AppendReject appends a REJECT frame; a long reason is truncated (at a
// UTF-8 boundary).
func AppendReject(dst []byte, req uint32, code Code, reason string) []byte {
	if len(reason) > MaxReason {
		reason = reason[:MaxReason]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	dst = header(dst, TypeReject, 7+len(reason))
	dst = be.AppendUint32(dst, req)
	dst = be.AppendUint16(dst, uint16(code))
	dst = append(dst, byte(len(reason)))
	return append(dst, reason...)
}

// Append re-encodes a decoded frame (the fuzz test's canonical check).
func Append(dst []byte, f *Frame) []byte {
	switch f.Type {
	case TypeHello:
		return AppendHello(dst, f.Hello)
	case TypeHave:
		return AppendHave(dst, f.Req, f.Have)
	case TypeWant:
		return AppendWant(dst, f.Req, f.Want)
	case TypeRequest:
		return AppendRequest(dst, f.Req, f.CID, f.Off, f.Len)
	case TypePiece:
		return AppendPiece(dst, f.Req, f.Pos, f.Data)
	case TypeCancel:
		return AppendCancel(dst, f.Req)
	case TypeReject:
		return AppendReject(dst, f.Req, f.Code, f.Reason)
	}
	return dst
}
