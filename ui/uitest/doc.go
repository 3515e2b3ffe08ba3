// Package uitest holds the operator console's browser tests: a real headless
// Chromium (Debian's chromium package), driven with chromedp, clicks through the
// console of package ui against a real PostgreSQL and a running worker. It is a
// module of its own so that the core module does not depend on chromedp.
//
//	cd ui/uitest && go test ./...                 # needs chromium (apt-get install chromium)
//	cd ui/uitest && go test ./... -screenshots    # also rewrites docs/console/*.png
package uitest
