// json_to_pyobj against CPython: the expected bytes are `pickle.dumps(json.loads(TEXT), protocol=2)`
// in CPython 3.11 for the same text (keys written sorted, the order nlohmann::json keeps), so
// equality means the tree is what json.loads gives: objects dicts, null None, nested containers.
#include "formats/torch/pickle/py_json.h"

#include <gtest/gtest.h>

#include <string>

#include "formats/torch/pickle/pickler.h"

namespace ckpt::torch {
namespace {

TEST(PyJson, PicklesLikeJsonLoads) {
  const char* text =
      R"({"args": {"list": [1, null, 2.5, "s", true, {"k": []}], "none": null, "obj": {}}, "big": 9223372036854775807, "neg": -3})";
  PyArena a;
  auto bytes = pickle_dumps(json_to_pyobj(a, nlohmann::json::parse(text)));
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  const char expected[] =
      "\200\002}q\000(X\004\000\000\000argsq\001}q\002(X\004\000\000\000listq\003]q\004(K\001NG@\004\000\000\000\000\000\000X\001"
      "\000\000\000sq\005\210}q\006X\001\000\000\000kq\007]q\010seX\004\000\000\000noneq\011NX\003\000\000\000objq\012}q\013uX\003"
      "\000\000\000bigq\014\212\010\377\377\377\377\377\377\377\177X\003\000\000\000negq\015J\375\377\377\377u.";
  EXPECT_EQ(*bytes, std::string(expected, sizeof(expected) - 1));
}

TEST(PyJson, KindsOfValues) {
  PyArena a;
  const PyObj* o = json_to_pyobj(a, nlohmann::json::parse(R"({"d": {"x": 1}, "n": null, "u": 18446744073709551615, "v": 7})"));
  ASSERT_EQ(o->type, PyType::kDict);
  EXPECT_EQ(o->get("d")->type, PyType::kDict);
  EXPECT_EQ(o->get("d")->get("x")->i, 1);
  EXPECT_EQ(o->get("n")->type, PyType::kNone);
  ASSERT_EQ(o->get("u")->type, PyType::kFloat);  // above INT64_MAX: a float, not a wrapped negative int
  EXPECT_EQ(o->get("u")->f, 18446744073709551615.0);
  ASSERT_EQ(o->get("v")->type, PyType::kInt);
  EXPECT_EQ(o->get("v")->i, 7);
}

}  // namespace
}  // namespace ckpt::torch
