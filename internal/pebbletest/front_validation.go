package pebbletest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SetValidationTime makes the CA appear to take d to validate every challenge
// answered through the front from now on, as a CA validating from several network
// perspectives does, where Pebble takes milliseconds: until d after the front passed
// on the CA's answer to a challenge, the challenge's authorization is answered
// "pending" (its challenge "processing") even when the CA has decided it. From then
// on the CA's own answers pass. Each challenge and the looks at its authorization
// are recorded (Front.Validations), with d of 0 too.
func (f *Front) SetValidationTime(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.validationTime = d
}

// Validation is a challenge answered through the front, and the looks at its
// authorization that followed.
type Validation struct {
	// Authorization is the path of the challenge's authorization.
	Authorization string
	// Answered is when the front passed on the CA's answer to the challenge, and
	// Ready that plus the validation time (SetValidationTime): from Ready on, the
	// CA's verdict is passed on.
	Answered, Ready time.Time
	// Looks are the requests for the authorization after Answered.
	Looks []Look
}

// Look is a request for an authorization.
type Look struct {
	// At is when the request reached the front (as Seen.At).
	At time.Time
	// Status is the authorization's status as answered; Held says the CA had
	// decided it "valid" and the front answered "pending" (before Ready).
	Status string
	Held   bool
}

// Validations are the challenges answered through the front so far, in order.
func (f *Front) Validations() []Validation {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Validation, len(f.validations))
	for i, v := range f.validations {
		out[i] = *v
		out[i].Looks = slices.Clone(v.Looks)
	}
	return out
}

// arrivedKey is the context key of the time a request reached the front.
type arrivedKey struct{}

// arrived is when r reached the front, or now when unknown.
func arrived(r *http.Request) time.Time {
	if at, ok := r.Context().Value(arrivedKey{}).(time.Time); ok {
		return at
	}
	return time.Now()
}

// withArrival records at in r's context, for the CA's answer to tell.
func withArrival(r *http.Request, at time.Time) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), arrivedKey{}, at))
}

// holdValidation records a challenge's answer and holds an authorization's "valid"
// back until its Ready (SetValidationTime). It runs on every answer the CA gave.
func (f *Front) holdValidation(resp *http.Response) error {
	if resp.Request == nil || resp.StatusCode != http.StatusOK || resp.Request.Method != http.MethodPost {
		return nil
	}
	switch StepOf(resp.Request) {
	case StepChallenge:
		authz := upLink(resp.Header)
		if authz == "" {
			return nil
		}
		now := time.Now()
		f.mu.Lock()
		d := f.validationTime
		f.validations = append(f.validations, &Validation{Authorization: authz, Answered: now, Ready: now.Add(d)})
		f.mu.Unlock()
		if d > 0 {
			return rewriteStatus(resp, map[string]string{"valid": "processing"})
		}
	case StepAuthorization:
		at := arrived(resp.Request)
		f.mu.Lock()
		var v *Validation
		for _, c := range f.validations {
			if c.Authorization == resp.Request.URL.Path && !at.Before(c.Answered) {
				v = c
			}
		}
		f.mu.Unlock()
		if v == nil {
			return nil
		}
		status, err := readStatus(resp)
		if err != nil {
			return err
		}
		look := Look{At: at, Status: status}
		if status == "valid" && at.Before(v.Ready) {
			look.Status, look.Held = "pending", true
			if err := rewriteStatus(resp, map[string]string{"valid": "pending"}); err != nil {
				return err
			}
		}
		f.mu.Lock()
		v.Looks = append(v.Looks, look)
		f.mu.Unlock()
	}
	return nil
}

// upLink is the path of the Link rel="up" of an answer (a challenge's
// authorization), or "".
func upLink(h http.Header) string {
	for _, l := range h.Values("Link") {
		target, params, ok := strings.Cut(l, ";")
		if ok && strings.Contains(params, `rel="up"`) {
			target = strings.Trim(strings.TrimSpace(target), "<>")
			return urlPath(target)
		}
	}
	return ""
}

// readStatus is the "status" of a JSON answer, leaving the body to be read again.
func readStatus(resp *http.Response) (string, error) {
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return "", err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var doc struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(body, &doc)
	return doc.Status, nil
}

// rewriteStatus replaces the "status" of a JSON answer (an authorization or a
// challenge), and of the challenges it holds, by from's value for it; a challenge
// held back loses its "validated" time.
func rewriteStatus(resp *http.Response, from map[string]string) error {
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	var doc map[string]any
	if json.Unmarshal(body, &doc) == nil {
		swap := func(m map[string]any, to string) {
			if s, ok := m["status"].(string); ok && from[s] != "" {
				m["status"] = to
				delete(m, "validated")
			}
		}
		if s, ok := doc["status"].(string); ok && from[s] != "" {
			swap(doc, from[s])
		}
		if chs, ok := doc["challenges"].([]any); ok {
			for _, c := range chs {
				if m, ok := c.(map[string]any); ok {
					swap(m, "processing")
				}
			}
		}
		body, _ = json.Marshal(doc)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// chainModify runs each of fs on an answer, in turn, until one fails.
func chainModify(fs ...func(*http.Response) error) func(*http.Response) error {
	return func(resp *http.Response) error {
		for _, f := range fs {
			if err := f(resp); err != nil {
				return err
			}
		}
		return nil
	}
}
