package worker

// TimerSlack is how late the worker's timer fires on purpose (timerSlack).
const TimerSlack = timerSlack
