package signaling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// The JSON keys of Message and of its "limits" object, from their struct
// tags. Read-only after package initialization.
var (
	messageKeys = jsonKeys(reflect.TypeFor[Message]())
	limitsKeys  = jsonKeys(reflect.TypeFor[Limits]())
)

func jsonKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// checkKeys refuses a message object whose keys encoding/json would read
// differently from a strict decoder: a key given twice, or a key that is
// not a field name but matches one when case is ignored (encoding/json
// folds case as bytes.EqualFold does, Unicode simple folding included:
// "ſid" would set "sid"). The keys of "limits" are checked the same way.
// The content of "data" and of unknown fields is not the server's to
// read and is not checked. Input that is not a JSON object is left to
// json.Unmarshal to refuse.
func checkKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	return checkObject(dec, messageKeys, "")
}

// checkObject reads the members of an object whose '{' was read, and its
// '}'.
func checkObject(dec *json.Decoder, known []string, path string) error {
	seen := make(map[string]bool)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not a JSON message: %v", err)
		}
		key, _ := t.(string)
		if seen[key] {
			return fmt.Errorf("key %q given twice", path+key)
		}
		seen[key] = true
		for _, k := range known {
			if key != k && strings.EqualFold(key, k) {
				return fmt.Errorf("key %q: keys are case-sensitive; want %q", path+key, path+k)
			}
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("not a JSON message: %v", err)
		}
		if path == "" && key == "limits" {
			sub := json.NewDecoder(bytes.NewReader(raw))
			if t, err := sub.Token(); err == nil && t == json.Delim('{') {
				if err := checkObject(sub, limitsKeys, "limits."); err != nil {
					return err
				}
			}
		}
	}
	_, err := dec.Token() // '}'
	if err != nil {
		return fmt.Errorf("not a JSON message: %v", err)
	}
	return nil
}
