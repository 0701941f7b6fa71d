// The pickler against CPython: each expected byte string is what `pickle.dumps(obj, protocol=2)`
// gives in CPython 3.11 for the same object (printed by Python, pasted here), so equality means
// ckpt writes exactly what Python writes. Plus the refusals (PickleWriteInvalid).
#include "formats/torch/pickle/pickler.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt::torch {
namespace {

#define PICKLER_TEST_BYTES(lit) std::string(lit, sizeof(lit) - 1)

std::string pickler_test_dumps(const PyObj* o) {
  auto r = pickle_dumps(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

TEST(Pickler, IntsLikeCPython) {
  // [0, 255, 256, 65535, 65536, -1, 2**31-1, -2**31, 2**31, -2**31-1, 2**63-1, -2**63, 128, -129]
  PyArena a;
  std::vector<const PyObj*> v;
  for (int64_t x : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536}, int64_t{-1}, int64_t{2147483647},
                    int64_t{-2147483648LL}, int64_t{2147483648LL}, int64_t{-2147483649LL}, INT64_MAX, INT64_MIN, int64_t{128},
                    int64_t{-129}})
    v.push_back(a.integer(x));
  EXPECT_EQ(pickler_test_dumps(a.list(v)),
            PICKLER_TEST_BYTES("\200\002]q\000(K\000K\377M\000\001M\377\377J\000\000\001\000J\377\377\377\377J\377\377\377\177J"
               "\000\000\000\200\212\005\000\000\000\200\000\212\005\377\377\377\177\377\212\010\377\377\377\377"
               "\377\377\377\177\212\010\000\000\000\000\000\000\000\200K\200J\177\377\377\377e."));
}

TEST(Pickler, MixedLikeCPython) {
  // (None, True, False, 1.5, -0.0, 'hé', ['a', ('b',)], {})
  PyArena a;
  const PyObj* t = a.tuple({a.none(), a.boolean(true), a.boolean(false), a.real(1.5), a.real(-0.0), a.str("h\xc3\xa9"),
                            a.list({a.str("a"), a.tuple({a.str("b")})}), a.dict({})});
  EXPECT_EQ(pickler_test_dumps(t), PICKLER_TEST_BYTES("\200\002(N\210\211G?\370\000\000\000\000\000\000G\200\000\000\000\000\000\000\000X\003\000\000"
               "\000h\303\251q\000]q\001(X\001\000\000\000aq\002X\001\000\000\000bq\003\205q\004e}q\005tq\006."));
}

TEST(Pickler, BytesLikeCPython) {
  PyArena a;
  EXPECT_EQ(pickler_test_dumps(a.bytes(std::string("\x00\xff\x80" "A", 4))),
            PICKLER_TEST_BYTES("\200\002c_codecs\012encode\012q\000X\006\000\000\000\000\303\277\302\200Aq\001X\006\000\000\000l"
               "atin1q\002\206q\003Rq\004."));
}

TEST(Pickler, OrderedDictLikeCPython) {
  PyArena a;
  const PyObj* od = a.ordered_dict({{a.str("x"), a.integer(1)}, {a.str("y"), a.list({a.integer(1), a.integer(2)})}});
  EXPECT_EQ(pickler_test_dumps(od), PICKLER_TEST_BYTES("\200\002ccollections\012OrderedDict\012q\000)Rq\001(X\001\000\000\000xq\002K\001X\001\000\000"
               "\000yq\003]q\004(K\001K\002eu."));
}

TEST(Pickler, TuplesLikeCPython) {
  PyArena a;
  auto ints = [&](int n) {
    std::vector<const PyObj*> v;
    for (int i = 1; i <= n; ++i) v.push_back(a.integer(i));
    return a.tuple(v);
  };
  EXPECT_EQ(pickler_test_dumps(a.tuple({ints(0), ints(1), ints(2), ints(3), ints(4)})),
            PICKLER_TEST_BYTES("\200\002()K\001\205q\000K\001K\002\206q\001K\001K\002K\003\207q\002(K\001K\002K\003K\004tq\003tq"
               "\004."));
}

TEST(Pickler, SharedObjectsAndSelfContainingList) {
  PyArena a;
  // l = []; l.append(l)
  PyObj* l = a.make(PyType::kList);
  l->items.push_back(l);
  EXPECT_EQ(pickler_test_dumps(l), PICKLER_TEST_BYTES("\200\002]q\000h\000a."));
  // x = 'x'; [1.5, x, [x], {'k': None}]
  const PyObj* x = a.str("x");
  const PyObj* v = a.list({a.real(1.5), x, a.list({x}), a.dict({{a.str("k"), a.none()}})});
  EXPECT_EQ(pickler_test_dumps(v),
            PICKLER_TEST_BYTES("\200\002]q\000(G?\370\000\000\000\000\000\000X\001\000\000\000xq\001]q\002h\001a}q\003X\001\000"
                               "\000\000kq\004Nse."));
}

TEST(Pickler, RefusesWhatPythonCouldNotRead) {
  PyArena a;
  auto code = [](const PyObj* o) {
    auto r = pickle_dumps(o);
    return r.ok() ? std::string("ok") : r.status().code();
  };
  EXPECT_EQ(code(a.str("\xff")), "PickleWriteInvalid");             // not UTF-8
  EXPECT_EQ(code(a.str("\xed\xa0\x80")), "PickleWriteInvalid");     // a surrogate
  EXPECT_EQ(code(a.str("\xe2\x82")), "PickleWriteInvalid");         // truncated sequence
  EXPECT_EQ(code(a.str("\xc0\xaf")), "PickleWriteInvalid");         // overlong
  EXPECT_EQ(code(a.str("\xf0\x9f\x98\x80")), "ok");                 // U+1F600
  PyObj* t = a.make(PyType::kTuple);
  t->items.push_back(t);
  EXPECT_EQ(code(t), "PickleWriteInvalid");                         // a tuple containing itself
  const PyObj* deep = a.none();
  for (int i = 0; i < 1100; ++i) deep = a.list({deep});
  EXPECT_EQ(code(deep), "PickleWriteInvalid");
  EXPECT_EQ(code(a.record("nodot", a.tuple({}), nullptr)), "PickleWriteInvalid");
  EXPECT_EQ(code(a.record("m.C", a.list({}), nullptr)), "PickleWriteInvalid");  // args must be a tuple
  TensorRef tr;
  tr.storage = StorageRef{"0", DType::kF32, 4, "cpu"};
  tr.size = {2, 2};
  tr.stride = {2};
  EXPECT_EQ(code(a.tensor(tr)), "PickleWriteInvalid");
}

}  // namespace
}  // namespace ckpt::torch

#undef PICKLER_TEST_BYTES
