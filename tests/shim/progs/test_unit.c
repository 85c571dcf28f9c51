/* Unit tests of the shim's pure parts: limit arithmetic, size estimates, the
 * allocation table and config parsing. Prints one line per failed check and exits
 * non-zero if any failed. Built with ASan/UBSan by `make -C tests/shim/progs check`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static int failures, checks;
#define CHECK(cond)                                                       \
    do {                                                                  \
        checks++;                                                         \
        if (!(cond)) {                                                    \
            failures++;                                                   \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);        \
        }                                                                 \
    } while (0)

static void test_budget(void)
{
    CHECK(vg_budget_fits(0, 100, 100));
    CHECK(!vg_budget_fits(0, 101, 100));
    CHECK(vg_budget_fits(60, 40, 100));
    CHECK(!vg_budget_fits(61, 40, 100));
    CHECK(!vg_budget_fits(150, 0, 100) || 0); /* over already: nothing fits */
    CHECK(vg_budget_fits(UINT64_MAX - 1, UINT64_MAX, 0)); /* unlimited */
    CHECK(!vg_budget_fits(10, UINT64_MAX, 100)); /* no overflow */
    size_t pitch = 0;
    CHECK(vg_pitch_bytes(1, 10, &pitch) == 5120 && pitch == 512);
    CHECK(vg_pitch_bytes(512, 3, &pitch) == 1536 && pitch == 512);
    CHECK(vg_pitch_bytes(513, 2, &pitch) == 2048 && pitch == 1024);
    CHECK(vg_pitch_bytes((size_t)1 << 62, 16, NULL) == UINT64_MAX);
    CHECK(vg_array_bytes(100, 0, 0, CU_AD_FORMAT_FLOAT, 4) == 1600);
    CHECK(vg_array_bytes(64, 64, 2, CU_AD_FORMAT_HALF, 1) == 64 * 64 * 2 * 2);
    CHECK(vg_array_bytes(8, 8, 0, CU_AD_FORMAT_UNSIGNED_INT8, 2) == 128);
    CHECK(vg_mipmap_bytes(8, 8, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 4) == 64 + 16 + 4 + 1);
    CHECK(vg_mipmap_bytes(8, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 2) == 8 + 4);
}

static void test_table(void)
{
    vg_alloc_table t = {0};
    vg_alloc a;
    CHECK(vg_table_put(&t, (vg_alloc){.key = 0, .bytes = 1}) == -1);
    for (uint64_t k = 1; k <= 5000; k++)
        CHECK(vg_table_put(&t, (vg_alloc){.key = k * 512, .bytes = k, .dev = (int)(k % 3)}) == 0);
    CHECK(t.len == 5000);
    /* remove every other one, then the rest must still be found */
    for (uint64_t k = 1; k <= 5000; k += 2) {
        CHECK(vg_table_take(&t, k * 512, &a) == 1);
        CHECK(a.bytes == k && a.dev == (int)(k % 3));
    }
    CHECK(vg_table_take(&t, 512, &a) == 0);
    for (uint64_t k = 2; k <= 5000; k += 2) CHECK(vg_table_peek(&t, k * 512, &a) && a.bytes == k);
    for (uint64_t k = 2; k <= 5000; k += 2) CHECK(vg_table_take(&t, k * 512, NULL) == 1);
    CHECK(t.len == 0);
    CHECK(vg_table_peek(&t, 1024, NULL) == 0);
    /* overwrite keeps one entry */
    vg_table_put(&t, (vg_alloc){.key = 7, .bytes = 1});
    vg_table_put(&t, (vg_alloc){.key = 7, .bytes = 2});
    CHECK(t.len == 1 && vg_table_peek(&t, 7, &a) && a.bytes == 2);
    vg_table_free(&t);
}

static void test_config(void)
{
    vg_config c;
    const char *good =
        "# written by the plugin\n"
        "version=1\n"
        "device.0.uuid=GPU-8d0b\n"
        "device.0.memory_limit=3221225472 # bytes\n"
        "device.0.core_limit=30\n"
        "device.0.core_policy=balance\n"
        "device.0.oversubscribe=1\n"
        "device.1.memory_limit=0\n"
        "device.1.core_limit=100\n"
        "device.1.future_knob=7\n"
        "future_key=whatever\n"
        "priority=2\n"
        "  state_dir = /var/run/vgpud  \n";
    CHECK(vg_config_parse(good, &c) == 0);
    CHECK(c.device_count == 2);
    CHECK(!strcmp(c.dev[0].uuid, "GPU-8d0b"));
    CHECK(c.dev[0].memory_limit == 3221225472ull);
    CHECK(c.dev[0].core_limit == 30 && c.dev[0].core_policy == VG_POLICY_BALANCE);
    CHECK(c.dev[0].oversubscribe == 1);
    CHECK(c.dev[1].memory_limit == 0 && c.dev[1].core_limit == 0);
    CHECK(c.priority == 2 && !strcmp(c.state_dir, "/var/run/vgpud"));

    const char *bad[] = {
        "device.0.memory_limit=1\n",                         /* no version */
        "version=2\ndevice.0.memory_limit=1\n",              /* unknown version */
        "version=1\ndevice.0.memory_limit=12x\n",            /* bad number */
        "version=1\ndevice.0.memory_limit=-5\n",             /* negative */
        "version=1\ndevice.0.core_limit=101\n",              /* percent > 100 */
        "version=1\ndevice.0.core_policy=greedy\n",          /* unknown policy */
        "version=1\ndevice.99.memory_limit=1\n",             /* index out of range */
        "version=1\ndevice.x.memory_limit=1\n",              /* bad index */
        "version=1\njunk line\n",                            /* no '=' */
        "version=1\ndevice.0.uuid=GPU-1\n",                  /* device without memory_limit */
        "version=1\ndevice.0.memory_limit=99999999999999999999999\n", /* overflow */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int r = vg_config_parse(bad[i], &c);
        CHECK(r == -1 && c.error[0]);
        if (r != -1) printf("  accepted: %s", bad[i]);
    }
    uint64_t v;
    CHECK(vg_parse_bytes("3g", &v) == 0 && v == 3ull << 30);
    CHECK(vg_parse_bytes("512MiB", &v) == 0 && v == 512ull << 20);
    CHECK(vg_parse_bytes("10k", &v) == 0 && v == 10240);
    CHECK(vg_parse_bytes("", &v) == -1 && vg_parse_bytes("g", &v) == -1);
    CHECK(vg_parse_bytes("20000000000000000000", &v) == -1);
    CHECK(vg_parse_bytes("17179869184g", &v) == -1); /* overflow with suffix */
}

int main(void)
{
    test_budget();
    test_table();
    test_config();
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}
