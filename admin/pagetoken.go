package kagziadmin

import (
	"encoding/base64"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kagzi/kagzi/admin/adminpb"
)

const (
	defaultPageSize = 50
	maxPageSize     = 1000
)

// pageSize validates a PageRequest's size: 0 is the default.
func pageSize(p *adminpb.PageRequest) (int, error) {
	n := int(p.GetPageSize())
	switch {
	case n == 0:
		return defaultPageSize, nil
	case n < 0 || n > maxPageSize:
		return 0, status.Errorf(codes.InvalidArgument, "page size %d is not within 1..%d", n, maxPageSize)
	}
	return n, nil
}

// encodePageToken wraps a listing's cursor so that the token is opaque and is
// accepted only by the same RPC in the same namespace.
func encodePageToken(rpc, namespace, cursor string) string {
	if cursor == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte("v1\n" + rpc + "\n" + namespace + "\n" + cursor))
}

// decodePageToken returns the cursor of a token made by encodePageToken for the same
// RPC and namespace ("" for an empty token).
func decodePageToken(tok, rpc, namespace string) (string, error) {
	if tok == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	parts := strings.SplitN(string(raw), "\n", 4)
	if err != nil || len(parts) != 4 || parts[0] != "v1" || parts[3] == "" {
		return "", status.Error(codes.InvalidArgument, "malformed page token")
	}
	if parts[1] != rpc || parts[2] != namespace {
		return "", status.Errorf(codes.InvalidArgument,
			"page token belongs to another listing (%s in namespace %q)", parts[1], parts[2])
	}
	return parts[3], nil
}

func pageInfo(next string) *adminpb.PageInfo {
	return &adminpb.PageInfo{NextPageToken: next, HasMore: next != ""}
}
