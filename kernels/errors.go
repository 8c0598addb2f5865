package kernels

import (
	"errors"
	"fmt"
)

// ErrUnknownOp is returned for an op this build does not know.
var ErrUnknownOp = errors.New("kernels: unknown op")

// ErrDescriptor is wrapped by every error about a kernel artifact: a
// malformed descriptor, or WGSL that does not match its descriptor.
var ErrDescriptor = errors.New("kernels: invalid kernel descriptor")

// Errors of Decode and Verify, each wrapping ErrInvalid.
var (
	ErrInvalid     = errors.New("kernels: invalid endorsement")
	ErrSchema      = fmt.Errorf("%w: malformed", ErrInvalid)
	ErrSignature   = fmt.Errorf("%w: bad signature", ErrInvalid)
	ErrClass       = fmt.Errorf("%w: another device class", ErrInvalid)
	ErrABI         = fmt.Errorf("%w: another ABI", ErrInvalid)
	ErrExpired     = fmt.Errorf("%w: expired", ErrInvalid)
	ErrNotYetValid = fmt.Errorf("%w: issued in the future", ErrInvalid)
	ErrNotFaster   = fmt.Errorf("%w: not faster by the rule", ErrInvalid)
	ErrReplay      = fmt.Errorf("%w: replayed", ErrInvalid)
)
