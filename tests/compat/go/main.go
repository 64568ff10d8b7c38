// The compat scenario harness for github.com/apache/rocketmq-client-go/v2:
// `compat-go SCENARIO NAMESRV [key=value ...]` runs one scenario against a name server and
// prints one JSON object per line per event, with the event names and fields of the Java
// harness (tests/compat/java) so tests/compat judges both alike. Exit 0: everything
// awaited was seen; 3: the deadline passed first ("timeout" event); 1: an error.
// Scenarios: sends ordered tags sql broadcast delay retry transaction. The topic must
// exist; the harness waits until the name server routes it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

var outMu sync.Mutex

// emit prints one event line; safe from any goroutine.
func emit(kind string, fields map[string]any) {
	fields["event"] = kind
	fields["atMs"] = time.Now().UnixMilli()
	line, _ := json.Marshal(fields)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(line))
}

type timeout struct{ what string }

func (t timeout) Error() string { return t.what }

type harness struct {
	scenario, namesrv, topic, group, run string
	count                                int
	opts                                 map[string]string
	deadline                             time.Time
}

func (h *harness) intOpt(key string, dflt int) int {
	if v, ok := h.opts[key]; ok {
		n, err := strconv.Atoi(v)
		if err == nil {
			return n
		}
	}
	return dflt
}

// seen records deliveries per key and tells when every expected key arrived.
type seen struct {
	mu   sync.Mutex
	keys map[string]int
}

func newSeen() *seen { return &seen{keys: map[string]int{}} }

func (s *seen) add(key string) {
	s.mu.Lock()
	s.keys[key]++
	s.mu.Unlock()
}

func (s *seen) missing(expected []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, k := range expected {
		if s.keys[k] == 0 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (h *harness) awaitKeys(expected []string, s *seen) error {
	for {
		m := s.missing(expected)
		if len(m) == 0 {
			return nil
		}
		if time.Now().After(h.deadline) {
			if len(m) > 5 {
				m = m[:5]
			}
			return timeout{fmt.Sprintf("%d of %d keys never received, e.g. %v", len(s.missing(expected)), len(expected), m)}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) awaitRoute() error {
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{h.namesrv})))
	if err != nil {
		return err
	}
	defer a.Close()
	for {
		mqs, err := a.FetchPublishMessageQueues(context.Background(), h.topic)
		if err == nil && len(mqs) > 0 {
			return nil
		}
		if time.Now().After(h.deadline) {
			return timeout{"route of " + h.topic}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *harness) producer(extra ...producer.Option) (rocketmq.Producer, error) {
	opts := append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{h.namesrv})),
		producer.WithGroupName("pg-" + h.run),
		producer.WithInstanceName(h.run + "-producer"),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(5 * time.Second),
	}, extra...)
	return rocketmq.NewProducer(opts...)
}

func (h *harness) consumer(instance string, extra ...consumer.Option) (rocketmq.PushConsumer, error) {
	opts := append([]consumer.Option{
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{h.namesrv})),
		consumer.WithGroupName(h.group),
		consumer.WithInstance(h.run + "-" + instance),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}, extra...)
	return rocketmq.NewPushConsumer(opts...)
}

func message(topic, tag, key string) *primitive.Message {
	m := primitive.NewMessage(topic, []byte("body of "+key))
	m.WithTag(tag)
	m.WithKeys([]string{key})
	return m
}

func sentEvent(mode, key string, r *primitive.SendResult) map[string]any {
	return map[string]any{"mode": mode, "key": key, "msgId": r.MsgID, "offsetMsgId": r.OffsetMsgID,
		"broker": r.MessageQueue.BrokerName, "queue": r.MessageQueue.QueueId, "queueOffset": r.QueueOffset,
		"status": statusName(r.Status)}
}

func statusName(s primitive.SendStatus) string {
	switch s {
	case primitive.SendOK:
		return "SEND_OK"
	case primitive.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case primitive.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case primitive.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	}
	return "UNKNOWN_ERROR"
}

func receivedEvent(consumerName string, m *primitive.MessageExt) map[string]any {
	queue := -1
	if m.Queue != nil {
		queue = m.Queue.QueueId
	}
	var seq any
	if v := m.GetProperty("seq"); v != "" {
		seq = v
	}
	return map[string]any{"consumer": consumerName, "key": m.GetKeys(), "topic": m.Topic, "tags": m.GetTags(),
		"queue": queue, "queueOffset": m.QueueOffset, "reconsumeTimes": m.ReconsumeTimes, "msgId": m.MsgId,
		"seq": seq, "bornMs": m.BornTimestamp, "storeMs": m.StoreTimestamp}
}

// recording subscribes c to the topic with sel; every delivery is an event and counted in
// s under key (or key#seq / key#reconsumeTimes when keyOf says so).
func (h *harness) recording(c rocketmq.PushConsumer, name string, sel consumer.MessageSelector, s *seen,
	keyOf func(*primitive.MessageExt) string, result consumer.ConsumeResult, retryLevel int) error {
	return c.Subscribe(h.topic, sel, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			emit("received", receivedEvent(name, m))
			s.add(keyOf(m))
		}
		if result == consumer.ConsumeRetryLater {
			if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
				cc.DelayLevelWhenNextConsume = retryLevel
			}
		}
		return result, nil
	})
}

func byKey(m *primitive.MessageExt) string { return m.GetKeys() }

func all(sel string) consumer.MessageSelector {
	return consumer.MessageSelector{Type: consumer.TAG, Expression: sel}
}

func run(h *harness) error {
	if err := h.awaitRoute(); err != nil {
		return err
	}
	switch h.scenario {
	case "sends":
		return sends(h)
	case "ordered":
		return ordered(h)
	case "tags", "sql":
		return filtered(h)
	case "broadcast":
		return broadcast(h)
	case "delay":
		return delay(h)
	case "retry":
		return retry(h)
	case "transaction":
		return transaction(h)
	}
	return fmt.Errorf("unknown scenario %q (sends ordered tags sql broadcast delay retry transaction)", h.scenario)
}

// started starts the consumer, then the producer; stop shuts both down.
func started(c rocketmq.PushConsumer, p rocketmq.Producer) (stop func(), err error) {
	if err = c.Start(); err != nil {
		return nil, err
	}
	if err = p.Start(); err != nil {
		_ = c.Shutdown()
		return nil, err
	}
	return func() { _ = p.Shutdown(); _ = c.Shutdown() }, nil
}

func sends(h *harness) error {
	s := newSeen()
	c, err := h.consumer("c1")
	if err != nil {
		return err
	}
	if err = h.recording(c, "c1", all("*"), s, byKey, consumer.ConsumeSuccess, 0); err != nil {
		return err
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	stop, err := started(c, p)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	var expected []string
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("sync-%d", i)
		r, err := p.SendSync(ctx, message(h.topic, "TagA", key))
		if err != nil {
			return err
		}
		expected = append(expected, key)
		emit("sent", sentEvent("sync", key, r))
	}
	var wg sync.WaitGroup
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("async-%d", i)
		expected = append(expected, key)
		wg.Add(1)
		err := p.SendAsync(ctx, func(_ context.Context, r *primitive.SendResult, err error) {
			defer wg.Done()
			if err != nil {
				emit("send-failed", map[string]any{"mode": "async", "key": key, "error": err.Error()})
				return
			}
			emit("sent", sentEvent("async", key, r))
		}, message(h.topic, "TagA", key))
		if err != nil {
			return err
		}
	}
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("oneway-%d", i)
		if err := p.SendOneWay(ctx, message(h.topic, "TagA", key)); err != nil {
			return err
		}
		expected = append(expected, key)
		emit("sent", map[string]any{"mode": "oneway", "key": key, "status": "ONEWAY"})
	}
	var batch []*primitive.Message
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("batch-%d", i)
		batch = append(batch, message(h.topic, "TagA", key))
		expected = append(expected, key)
	}
	r, err := p.SendSync(ctx, batch...)
	if err != nil {
		return err
	}
	// the Go client gives a batch no client-side ids: its messages are known by the
	// broker's (offset) ids, which is also what its consumer reports
	ids := strings.Split(r.MsgID, ",")
	if r.MsgID == "" {
		ids = strings.Split(r.OffsetMsgID, ",")
	}
	for i := 0; i < h.count; i++ {
		ev := sentEvent("batch", fmt.Sprintf("batch-%d", i), r)
		ev["queueOffset"] = r.QueueOffset + int64(i)
		ev["msgId"] = nil
		if i < len(ids) {
			ev["msgId"] = ids[i]
		}
		emit("sent", ev)
	}
	wg.Wait()
	return h.awaitKeys(expected, s)
}

func ordered(h *harness) error {
	keys := h.intOpt("keys", 8)
	s := newSeen()
	c, err := h.consumer("c1", consumer.WithConsumerOrder(true))
	if err != nil {
		return err
	}
	keyOf := func(m *primitive.MessageExt) string { return m.GetKeys() + "#" + m.GetProperty("seq") }
	if err = h.recording(c, "c1", all("*"), s, keyOf, consumer.ConsumeSuccess, 0); err != nil {
		return err
	}
	p, err := h.producer(producer.WithQueueSelector(producer.NewHashQueueSelector()))
	if err != nil {
		return err
	}
	stop, err := started(c, p)
	if err != nil {
		return err
	}
	defer stop()
	var expected []string
	for seq := 0; seq < h.count; seq++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("ord-%d", k)
			m := message(h.topic, "TagA", key)
			m.WithShardingKey(key)
			m.WithProperty("seq", strconv.Itoa(seq))
			r, err := p.SendSync(context.Background(), m)
			if err != nil {
				return err
			}
			ev := sentEvent("ordered", key, r)
			ev["seq"] = strconv.Itoa(seq)
			emit("sent", ev)
			expected = append(expected, key+"#"+strconv.Itoa(seq))
		}
	}
	return h.awaitKeys(expected, s)
}

// filtered: tags ("TagA || TagB"; TagC sent first) or sql (region/amount properties).
func filtered(h *harness) error {
	s := newSeen()
	c, err := h.consumer("c1")
	if err != nil {
		return err
	}
	sel := all("TagA || TagB")
	if h.scenario == "sql" {
		sel = consumer.MessageSelector{Type: consumer.SQL92, Expression: "region = 'eu' AND amount > 100"}
	}
	if err = h.recording(c, "c1", sel, s, byKey, consumer.ConsumeSuccess, 0); err != nil {
		return err
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	stop, err := started(c, p)
	if err != nil {
		return err
	}
	defer stop()
	type row struct{ a, prefix, amount string }
	unwanted, wanted := []row{{"TagC", "tagc-", ""}}, []row{{"TagA", "taga-", ""}, {"TagB", "tagb-", ""}}
	if h.scenario == "sql" {
		unwanted = []row{{"us", "sqlno-us-", "500"}, {"eu", "sqlno-small-", "50"}}
		wanted = []row{{"eu", "sqlyes-", "150"}}
	}
	var expected []string
	for pass, rows := range [][]row{unwanted, wanted} {
		for _, r := range rows {
			for i := 0; i < h.count; i++ {
				key := r.prefix + strconv.Itoa(i)
				var m *primitive.Message
				if h.scenario == "sql" {
					m = message(h.topic, "TagA", key)
					m.WithProperty("region", r.a)
					m.WithProperty("amount", r.amount)
				} else {
					m = message(h.topic, r.a, key)
				}
				res, err := p.SendSync(context.Background(), m)
				if err != nil {
					return err
				}
				mode := "unwanted"
				if pass == 1 {
					mode = "wanted"
					expected = append(expected, key)
				}
				emit("sent", sentEvent(mode, key, res))
			}
		}
	}
	return h.awaitKeys(expected, s)
}

func broadcast(h *harness) error {
	var consumers []rocketmq.PushConsumer
	seens := map[string]*seen{"b1": newSeen(), "b2": newSeen()}
	for _, name := range []string{"b1", "b2"} {
		c, err := h.consumer(name, consumer.WithConsumerModel(consumer.BroadCasting))
		if err != nil {
			return err
		}
		if err = h.recording(c, name, all("*"), seens[name], byKey, consumer.ConsumeSuccess, 0); err != nil {
			return err
		}
		if err = c.Start(); err != nil {
			return err
		}
		defer c.Shutdown()
		consumers = append(consumers, c)
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	if err = p.Start(); err != nil {
		return err
	}
	defer p.Shutdown()
	var expected []string
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("bc-%d", i)
		r, err := p.SendSync(context.Background(), message(h.topic, "TagA", key))
		if err != nil {
			return err
		}
		expected = append(expected, key)
		emit("sent", sentEvent("sync", key, r))
	}
	if err := h.awaitKeys(expected, seens["b1"]); err != nil {
		return err
	}
	return h.awaitKeys(expected, seens["b2"])
}

func delay(h *harness) error {
	s := newSeen()
	c, err := h.consumer("c1")
	if err != nil {
		return err
	}
	if err = h.recording(c, "c1", all("*"), s, byKey, consumer.ConsumeSuccess, 0); err != nil {
		return err
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	stop, err := started(c, p)
	if err != nil {
		return err
	}
	defer stop()
	var expected []string
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("delay-%d", i)
		m := message(h.topic, "TagA", key)
		m.WithDelayTimeLevel(h.intOpt("level", 3))
		r, err := p.SendSync(context.Background(), m)
		if err != nil {
			return err
		}
		expected = append(expected, key)
		emit("sent", sentEvent("delay", key, r))
	}
	return h.awaitKeys(expected, s)
}

// retry: RECONSUME_LATER every time; each key is delivered maxReconsumeTimes+1 times.
func retry(h *harness) error {
	maxTimes := h.intOpt("maxReconsumeTimes", 2)
	s := newSeen()
	c, err := h.consumer("c1", consumer.WithMaxReconsumeTimes(int32(maxTimes)))
	if err != nil {
		return err
	}
	keyOf := func(m *primitive.MessageExt) string { return m.GetKeys() + "#" + strconv.Itoa(int(m.ReconsumeTimes)) }
	if err = h.recording(c, "c1", all("*"), s, keyOf, consumer.ConsumeRetryLater, h.intOpt("retryLevel", 1)); err != nil {
		return err
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	stop, err := started(c, p)
	if err != nil {
		return err
	}
	defer stop()
	var expected []string
	for i := 0; i < h.count; i++ {
		key := fmt.Sprintf("retry-%d", i)
		r, err := p.SendSync(context.Background(), message(h.topic, "TagA", key))
		if err != nil {
			return err
		}
		emit("sent", sentEvent("sync", key, r))
		for t := 0; t <= maxTimes; t++ {
			expected = append(expected, key+"#"+strconv.Itoa(t))
		}
	}
	return h.awaitKeys(expected, s)
}

type txListener struct{ checked *seen }

func (l *txListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	switch {
	case strings.HasPrefix(m.GetKeys(), "tx-commit-"):
		return primitive.CommitMessageState
	case strings.HasPrefix(m.GetKeys(), "tx-rollback-"):
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

func (l *txListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	emit("check", map[string]any{"key": m.GetKeys(), "transactionId": m.TransactionId, "topic": m.Topic})
	l.checked.add(m.GetKeys())
	return primitive.CommitMessageState
}

func transaction(h *harness) error {
	s, checked := newSeen(), newSeen()
	c, err := h.consumer("c1")
	if err != nil {
		return err
	}
	if err = h.recording(c, "c1", all("*"), s, byKey, consumer.ConsumeSuccess, 0); err != nil {
		return err
	}
	p, err := rocketmq.NewTransactionProducer(&txListener{checked},
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{h.namesrv})),
		producer.WithGroupName("tpg-"+h.run), producer.WithInstanceName(h.run+"-tx"), producer.WithRetry(2))
	if err != nil {
		return err
	}
	if err = c.Start(); err != nil {
		return err
	}
	defer c.Shutdown()
	if err = p.Start(); err != nil {
		return err
	}
	defer p.Shutdown()
	states := map[primitive.LocalTransactionState]string{primitive.CommitMessageState: "COMMIT_MESSAGE",
		primitive.RollbackMessageState: "ROLLBACK_MESSAGE", primitive.UnkonwnState: "UNKNOW"}
	var expected, unknown []string
	for _, kind := range []string{"commit", "rollback", "unknown"} {
		for i := 0; i < h.count; i++ {
			key := fmt.Sprintf("tx-%s-%d", kind, i)
			r, err := p.SendMessageInTransaction(context.Background(), message(h.topic, "TagA", key))
			if err != nil {
				return err
			}
			ev := sentEvent("transaction", key, r.SendResult)
			ev["localState"] = states[r.State]
			emit("sent", ev)
			if kind != "rollback" {
				expected = append(expected, key)
			}
			if kind == "unknown" {
				unknown = append(unknown, key)
			}
		}
	}
	if err := h.awaitKeys(unknown, checked); err != nil {
		return err
	}
	return h.awaitKeys(expected, s)
}

func main() {
	rlog.SetLogLevel("error")
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: compat-go SCENARIO NAMESRV [topic=T] [group=G] [count=N] [timeoutS=S] [run=ID]")
		os.Exit(2)
	}
	h := &harness{scenario: os.Args[1], namesrv: os.Args[2], opts: map[string]string{}}
	for _, a := range os.Args[3:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			fmt.Fprintln(os.Stderr, "option not key=value: "+a)
			os.Exit(2)
		}
		h.opts[k] = v
	}
	h.run = h.opts["run"]
	if h.run == "" {
		h.run = strconv.FormatInt(time.Now().UnixMilli()%100_000_000, 36)
	}
	h.topic = h.opts["topic"]
	h.group = h.opts["group"]
	if h.group == "" {
		h.group = "cg-go-" + h.scenario + "-" + h.run
	}
	h.count = h.intOpt("count", 10)
	h.deadline = time.Now().Add(time.Duration(h.intOpt("timeoutS", 60)) * time.Second)
	emit("start", map[string]any{"scenario": h.scenario, "namesrv": h.namesrv, "topic": h.topic, "group": h.group})
	err := run(h)
	switch err.(type) {
	case nil:
		emit("done", map[string]any{"scenario": h.scenario})
		os.Exit(0)
	case timeout:
		emit("timeout", map[string]any{"missing": err.Error()})
		os.Exit(3)
	default:
		emit("error", map[string]any{"error": fmt.Sprintf("%T", err), "message": err.Error()})
		os.Exit(1)
	}
}
