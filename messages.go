package kagzi

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/kagzi/kagzi/internal/store"
)

// ListOptions page a listing of one run's signals or events.
type ListOptions struct {
	// PageSize is the most items a page holds: default 50, at most 1000.
	PageSize int
	// PageToken continues a listing: pass the NextPageToken of the previous page.
	PageToken string
}

// SignalInfo is a signal sent to a run, for ListSignals.
type SignalInfo struct {
	// ID orders the run's signals: a run receives those of one name in ID order.
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Payload is the signal's payload, decoded with the client's codec.
	Payload json.RawMessage `json:"payload,omitempty"`
	SentAt  time.Time       `json:"sent_at"`
	// ConsumedBy is the key of the WaitSignal step that received the signal; empty
	// while it waits to be received.
	ConsumedBy string `json:"consumed_by,omitempty"`
}

// SignalPage is one page of ListSignals, in the order the signals were sent.
type SignalPage struct {
	Signals []SignalInfo
	// NextPageToken fetches the next page; empty on the last page.
	NextPageToken string
}

// EventInfo is an event a run published (see Context.SetEvent), for ListEvents.
type EventInfo struct {
	Key string `json:"key"`
	// Value is the event's latest value, decoded with the client's codec.
	Value     json.RawMessage `json:"value,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// EventPage is one page of ListEvents, ordered by key.
type EventPage struct {
	Events []EventInfo
	// NextPageToken fetches the next page; empty on the last page.
	NextPageToken string
}

// ListSignals lists the signals sent to a run of the client's namespace, received or
// not, in the order they were sent. A run of another namespace is ErrNotFound.
// With Config.ReadPool it reads from it (a replica may lag the primary).
func (c *Client) ListSignals(ctx context.Context, runID string, o ListOptions) (*SignalPage, error) {
	if err := c.usable("ListSignals"); err != nil {
		return nil, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return nil, err
	}
	limit, err := pageSize(o.PageSize)
	if err != nil {
		return nil, err
	}
	var after int64
	if o.PageToken != "" {
		s, err := decodeStringToken(o.PageToken)
		if err != nil {
			return nil, err
		}
		if after, err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, invalidArgument("malformed page token %q", o.PageToken)
		}
	}
	rows, err := store.ListSignals(ctx, c.read, c.ns, id, after, limit+1)
	if err != nil {
		return nil, readError("kagzi: list signals of run "+runID, err)
	}
	page := &SignalPage{Signals: make([]SignalInfo, 0, min(len(rows), limit))}
	if len(rows) > limit {
		rows = rows[:limit]
		page.NextPageToken = encodeStringToken(strconv.FormatInt(rows[limit-1].ID, 10))
	}
	for _, s := range rows {
		info := SignalInfo{ID: s.ID, Name: s.Name, Payload: c.readPayload(s.Payload), SentAt: s.CreatedAt}
		if s.ConsumedBy != nil {
			info.ConsumedBy = *s.ConsumedBy
		}
		page.Signals = append(page.Signals, info)
	}
	return page, nil
}

// ListEvents lists the events a run of the client's namespace published, by key,
// each with its latest value. A run of another namespace is ErrNotFound.
// With Config.ReadPool it reads from it (a replica may lag the primary).
func (c *Client) ListEvents(ctx context.Context, runID string, o ListOptions) (*EventPage, error) {
	if err := c.usable("ListEvents"); err != nil {
		return nil, err
	}
	id, err := parseRunID(runID)
	if err != nil {
		return nil, err
	}
	limit, err := pageSize(o.PageSize)
	if err != nil {
		return nil, err
	}
	var after string
	if o.PageToken != "" {
		if after, err = decodeStringToken(o.PageToken); err != nil {
			return nil, err
		}
	}
	rows, err := store.ListEvents(ctx, c.read, c.ns, id, after, limit+1)
	if err != nil {
		return nil, readError("kagzi: list events of run "+runID, err)
	}
	page := &EventPage{Events: make([]EventInfo, 0, min(len(rows), limit))}
	if len(rows) > limit {
		rows = rows[:limit]
		page.NextPageToken = encodeStringToken(rows[limit-1].Key)
	}
	for _, e := range rows {
		page.Events = append(page.Events, EventInfo{Key: e.Key, Value: c.readPayload(e.Value), UpdatedAt: e.UpdatedAt})
	}
	return page, nil
}
