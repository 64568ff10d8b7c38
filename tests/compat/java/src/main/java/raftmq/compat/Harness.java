// The compat scenario harness: `Harness SCENARIO NAMESRV [key=value ...]` runs one
// scenario of the stock RocketMQ 4.9.7 Java client against a name server and prints one
// JSON line per event (Events). Exit 0: the scenario saw everything it waited for;
// 3: its deadline passed first (a "timeout" event says what was missing); 1: an error.
package raftmq.compat;

import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public final class Harness {
    /** A scenario's deadline passed before it saw what it waited for. */
    static final class Timeout extends Exception {
        Timeout(String what) {
            super(what);
        }
    }

    final Options opts;
    final String runId;
    final String topic;
    final String group;
    final int count;
    final long deadlineMs;

    Harness(Options opts) {
        this.opts = opts;
        this.runId = opts.str("run", Long.toString(System.currentTimeMillis() % 100_000_000L, 36));
        String name = opts.scenario.replace('_', '-');
        this.topic = opts.str("topic", "compat-" + name + "-" + runId);
        this.group = opts.str("group", "cg-" + name + "-" + runId);
        this.count = opts.integer("count", 10);
        this.deadlineMs = System.currentTimeMillis() + 1000L * opts.integer("timeoutS", 60);
    }

    public static void main(String[] args) {
        int rc;
        try {
            Options opts = new Options(args);
            // broadcasting consumers keep offsets in files: under the run's own user.home
            // (tests/compat/harness.py gives every run a fresh one) unless offsetDir= says
            String offsetDir = opts.str("offsetDir", null);
            if (offsetDir != null) {
                System.setProperty("rocketmq.client.localOffsetStoreDir", offsetDir);
            }
            Harness h = new Harness(opts);
            Events.of("start").put("scenario", opts.scenario).put("namesrv", opts.namesrv)
                .put("topic", h.topic).put("group", h.group).emit();
            Scenarios.run(h);
            Events.of("done").put("scenario", opts.scenario).emit();
            rc = 0;
        } catch (Timeout t) {
            Events.of("timeout").put("missing", t.getMessage()).emit();
            rc = 3;
        } catch (Throwable t) {
            Events.of("error").put("error", t.getClass().getName()).put("message", String.valueOf(t.getMessage()))
                .put("causes", causes(t)).emit();
            t.printStackTrace();
            rc = 1;
        }
        System.exit(rc);
    }

    /** The messages of `t` and its causes, outermost first (a client exception wraps the broker's remark). */
    static String causes(Throwable t) {
        StringBuilder b = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause()) {
            b.append(b.length() == 0 ? "" : " <- ").append(c.getMessage());
        }
        return b.toString();
    }

    // ---- clients -------------------------------------------------------------------

    /**
     * RocketMQ's AK/SK request signature (AclClientRPCHook) with the access key and secret key
     * in $RAFTMQ_COMPAT_ACCESS_KEY and $RAFTMQ_COMPAT_SECRET_KEY (never on the command line);
     * null without them: unsigned requests, as before.
     */
    static RPCHook aclHook() {
        String accessKey = System.getenv("RAFTMQ_COMPAT_ACCESS_KEY");
        String secretKey = System.getenv("RAFTMQ_COMPAT_SECRET_KEY");
        return accessKey == null || secretKey == null ? null
            : new AclClientRPCHook(new SessionCredentials(accessKey, secretKey));
    }

    DefaultMQProducer producer(String producerGroup) {
        DefaultMQProducer p = new DefaultMQProducer(producerGroup, aclHook());
        configure(p);
        return p;
    }

    DefaultMQPushConsumer pushConsumer(String consumerGroup, String instance) {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(consumerGroup, aclHook(),
            new AllocateMessageQueueAveragely());
        c.setNamesrvAddr(opts.namesrv);
        c.setVipChannelEnabled(false);
        c.setClientIP("127.0.0.1");
        c.setInstanceName(runId + "-" + instance);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setConsumeThreadMin(2);
        c.setConsumeThreadMax(4);
        return c;
    }

    void configure(DefaultMQProducer p) {
        p.setNamesrvAddr(opts.namesrv);
        p.setVipChannelEnabled(false);
        p.setClientIP("127.0.0.1");
        p.setInstanceName(runId + "-producer");
        p.setSendMsgTimeout(opts.integer("sendTimeoutMs", 5000));
        p.setRetryTimesWhenSendFailed(2);
        p.setRetryTimesWhenSendAsyncFailed(2);
    }

    DefaultMQAdminExt admin() throws Exception {
        DefaultMQAdminExt a = new DefaultMQAdminExt(5000);
        a.setNamesrvAddr(opts.namesrv);
        a.setVipChannelEnabled(false);
        a.setClientIP("127.0.0.1");
        a.setInstanceName(runId + "-admin");
        a.setAdminExtGroup("admin-" + runId);
        a.start();
        return a;
    }

    // ---- topics ------------------------------------------------------------------------

    /**
     * With createTopic=true, creates the scenario's topic on every master of the cluster
     * (what `mqadmin updateTopic -c` does); then waits until the name server routes it.
     */
    void prepareTopic(String name) throws Exception {
        DefaultMQAdminExt a = admin();
        try {
            if (opts.flag("createTopic", false)) {
                int queues = opts.integer("queues", 4);
                ClusterInfo info = a.examineBrokerClusterInfo();
                for (BrokerData bd : info.getBrokerAddrTable().values()) {
                    String master = bd.getBrokerAddrs().get(MixAll.MASTER_ID);
                    if (master != null) {
                        a.createAndUpdateTopicConfig(master, new TopicConfig(name, queues, queues, 6));
                        Events.of("topic-created").put("topic", name).put("broker", master).emit();
                    }
                }
            }
            awaitTrue("route of " + name, () -> {
                try {
                    TopicRouteData r = a.examineTopicRouteInfo(name);
                    return r != null && !r.getQueueDatas().isEmpty();
                } catch (Exception e) {
                    return false;
                }
            });
        } finally {
            a.shutdown();
        }
    }

    // ---- waiting -------------------------------------------------------------------------

    /** Polls `done` every 50 ms until the scenario's deadline; Timeout naming `what` after it. */
    void awaitTrue(String what, BooleanSupplier done) throws Timeout, InterruptedException {
        while (!done.getAsBoolean()) {
            if (System.currentTimeMillis() > deadlineMs) {
                throw new Timeout(what);
            }
            Thread.sleep(50);
        }
    }

    /** Waits until every key in `expected` is in `seen`; Timeout listing the missing ones. */
    void awaitKeys(Set<String> expected, Map<String, ?> seen) throws Timeout, InterruptedException {
        try {
            awaitTrue("keys", () -> seen.keySet().containsAll(expected));
        } catch (Timeout t) {
            Set<String> missing = ConcurrentHashMap.newKeySet();
            missing.addAll(expected);
            missing.removeAll(seen.keySet());
            throw new Timeout(missing.size() + " of " + expected.size() + " keys never received, e.g. "
                + missing.stream().sorted().limit(5).toList());
        }
    }

    // ---- events ---------------------------------------------------------------------------

    /** The "received" event of one delivered message. */
    static Events.Event received(String consumer, MessageExt m) {
        return Events.of("received")
            .put("consumer", consumer)
            .put("key", m.getKeys())
            .put("topic", m.getTopic())
            .put("tags", m.getTags())
            .put("queue", m.getQueueId())
            .put("queueOffset", m.getQueueOffset())
            .put("reconsumeTimes", m.getReconsumeTimes())
            .put("msgId", m.getMsgId())
            .put("seq", m.getUserProperty("seq"))
            .put("bornMs", m.getBornTimestamp())
            .put("storeMs", m.getStoreTimestamp())
            .put("retryTopic", m.getProperty(MessageExtConstants.RETRY_TOPIC));
    }

    /** Property names the client sets that the harness reads. */
    static final class MessageExtConstants {
        static final String RETRY_TOPIC = "RETRY_TOPIC";

        private MessageExtConstants() {
        }
    }
}
