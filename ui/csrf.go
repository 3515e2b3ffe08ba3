package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
)

// sessionCookie names the per-browser session the CSRF tokens are tied to.
const sessionCookie = "kagzi_console_session"

// errCSRF is a POST without the form token of its session, or from another origin.
var errCSRF = errors.New("the form's CSRF token is missing or wrong, or the request came from another site: reload the page and try again")

// csrfToken returns the CSRF token of the request's session, starting a session
// (a random id in a SameSite=Strict, HttpOnly cookie) when it has none. The token is
// an HMAC of the session id under the console's key: a page of another site can
// neither read it nor make it.
func (c *console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	session := ""
	if ck, err := r.Cookie(sessionCookie); err == nil && len(ck.Value) >= 22 {
		session = ck.Value
	} else {
		b := make([]byte, 18)
		_, _ = rand.Read(b)
		session = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: session, Path: "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		r.AddCookie(&http.Cookie{Name: sessionCookie, Value: session})
	}
	return c.sign(session)
}

func (c *console) sign(session string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("kagzi-console-csrf\x00" + session))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF checks a POST: the browser says it comes from this site (Sec-Fetch-Site,
// Origin), and its form's csrf field is its session's token.
func (c *console) checkCSRF(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return errCSRF
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return errCSRF
		}
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return errCSRF
	}
	want := c.sign(ck.Value)
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(want)) {
		return errCSRF
	}
	return nil
}
