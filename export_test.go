package kagzi

import "time"

// SetWaitPoll sets how long the client's Waits wait before their first look at the
// run without a notification: tests set an hour to show that a notification woke them.
func SetWaitPoll(c *Client, d time.Duration) { c.waitPoll = d }
