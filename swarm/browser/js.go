//go:build js

package browser

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall/js"
)

// Await waits for the JavaScript promise p. It must not be called from a
// js.FuncOf callback itself (the callback would wait on the event loop it
// holds): call it from a goroutine.
func Await(ctx context.Context, p js.Value) (js.Value, error) {
	type result struct {
		v   js.Value
		err error
	}
	ch := make(chan result, 1)
	then := js.FuncOf(func(this js.Value, args []js.Value) any {
		v := js.Undefined()
		if len(args) > 0 {
			v = args[0]
		}
		ch <- result{v: v}
		return nil
	})
	catch := js.FuncOf(func(this js.Value, args []js.Value) any {
		err := errors.New("rejected")
		if len(args) > 0 {
			err = JSError(args[0])
		}
		ch <- result{err: err}
		return nil
	})
	p.Call("then", then, catch)
	select {
	case r := <-ch:
		then.Release()
		catch.Release()
		return r.v, r.err
	case <-ctx.Done():
		// then and catch stay: the promise may still settle.
		return js.Undefined(), ctx.Err()
	}
}

// JSError makes a Go error of a thrown JavaScript value.
func JSError(v js.Value) error {
	if v.Type() == js.TypeObject && v.Get("message").Type() == js.TypeString {
		name := v.Get("name").String()
		if name == "NotFoundError" {
			return fmt.Errorf("%s: %w", v.Get("message").String(), fs.ErrNotExist)
		}
		return fmt.Errorf("%s: %s", name, v.Get("message").String())
	}
	return errors.New(v.String())
}

// JSFiles is Files over a JavaScript object with the methods (each
// returning a promise) write(name, Uint8Array), read(name, off, n) ->
// Uint8Array or null when there is no such file, remove(name) and
// list() -> [names]. The page's shell (static/app.js) makes one over OPFS,
// or IndexedDB where OPFS is missing.
type JSFiles struct{ v js.Value }

// NewJSFiles wraps the JavaScript storage object v.
func NewJSFiles(v js.Value) *JSFiles { return &JSFiles{v: v} }

func (f *JSFiles) Write(ctx context.Context, name string, data []byte) error {
	u := js.Global().Get("Uint8Array").New(len(data))
	js.CopyBytesToJS(u, data)
	_, err := Await(ctx, f.v.Call("write", name, u))
	return err
}

func (f *JSFiles) Read(ctx context.Context, name string, off, n int64) ([]byte, error) {
	v, err := Await(ctx, f.v.Call("read", name, off, n))
	if err != nil {
		return nil, err
	}
	if v.IsNull() || v.IsUndefined() {
		return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}
	b := make([]byte, v.Length())
	js.CopyBytesToGo(b, v)
	return b, nil
}

func (f *JSFiles) Remove(ctx context.Context, name string) error {
	_, err := Await(ctx, f.v.Call("remove", name))
	return err
}

func (f *JSFiles) List(ctx context.Context) ([]string, error) {
	v, err := Await(ctx, f.v.Call("list"))
	if err != nil {
		return nil, err
	}
	out := make([]string, v.Length())
	for i := range out {
		out[i] = v.Index(i).String()
	}
	return out, nil
}
