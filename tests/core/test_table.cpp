// ResultTable (core/table.h): the printed table and the JSON rows come from the same rows.
#include <gtest/gtest.h>

#include "core/table.h"

using namespace mf;

TEST(ResultTable, PrintsAlignedAndWritesTheSameRows) {
  ResultTable t({{"name", "name", "", -6}, {"n", "count", "", 5}, {"x", "ratio", "{:.2f}x", 7}});
  t.add({{"name", "a"}, {"n", 3}, {"x", 1.5}, {"extra", "json only"}});
  t.add({{"name", "bb"}, {"n", 12}});                          // no ratio: "-"
  t.add({{"name", "c"}, {"n", 1}, {"note", "not run: why"}});  // first two cells, then the note
  EXPECT_EQ(t.text(),
            "name   count   ratio\n"
            "a          3   1.50x\n"
            "bb        12       -\n"
            "c          1 not run: why\n");
  ASSERT_EQ(t.json().size(), 3u);
  EXPECT_EQ(t.json()[0]["extra"], "json only");
  EXPECT_DOUBLE_EQ(t.json()[0]["x"].get<double>(), 1.5);
  EXPECT_EQ(t.json()[2]["note"], "not run: why");
}
