#include <gtest/gtest.h>
#include "common/testutil.hpp"
using namespace qsdpa;
TEST(Smoke, ReferenceRuns) {
  test::Case c; test::Problem pr(c);
  auto p = pr.params(Backend::reference);
  Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
}
