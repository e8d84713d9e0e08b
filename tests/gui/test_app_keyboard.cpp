// The app's frame logic without a renderer (ImGui builds draw lists without one): keyboard shortcuts, playing
// through records, automatic selection and colours following the selection order. Built with the GUI app.
#include <gtest/gtest.h>

#ifdef PROPLAB_GUI_BINARY

#include <imgui_internal.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "gui/app/app_state.h"
#include "gui/data/synthetic_run.h"
#include "gui_test_support.h"

namespace proplab::gui {
namespace {

// GLFW's key codes, which ImGui 1.86 indexes io.KeysDown with (the GLFW backend maps them the same way).
constexpr int glfw_key_right = 262, glfw_key_left = 263, glfw_key_space = 32, glfw_key_o = 79, glfw_key_e = 69,
              glfw_key_f1 = 290;

class AppFrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1280, 800);
    io.DeltaTime = 1.0f / 60.0f;
    io.KeyMap[ImGuiKey_LeftArrow] = glfw_key_left;
    io.KeyMap[ImGuiKey_RightArrow] = glfw_key_right;
    io.KeyMap[ImGuiKey_Space] = glfw_key_space;
    unsigned char* pixels = nullptr;
    int width = 0, height = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);
    for (int i = 0; i < 3; ++i) {
      SyntheticRunSpec spec;
      spec.name = "run" + std::to_string(i);
      spec.records = 5 + i;  // 5, 6, 7 records
      write_synthetic_run(dir_ / ("run" + std::to_string(i) + ".h5"), spec);
    }
    state_.library = std::make_unique<RunLibrary>(std::vector<std::filesystem::path>{dir_.path()},
                                                  RunLibraryOptions{1.0, 1.0, false});
    state_.library->update_now();
  }
  void TearDown() override { ImGui::DestroyContext(context_); }

  // One frame with `key` (a GLFW code, or -1) held down.
  void frame(int key = -1, bool ctrl = false, float delta_s = 1.0f / 60.0f) {
    ImGuiIO& io = ImGui::GetIO();
    for (bool& down : io.KeysDown) down = false;
    if (key >= 0) io.KeysDown[key] = true;
    io.KeyCtrl = ctrl;
    io.DeltaTime = delta_s;
    ImGui::NewFrame();
    draw_frame(state_);
    ImGui::Render();
  }
  // A key press: down for one frame, then up.
  void press(int key, bool ctrl = false) {
    frame(key, ctrl);
    frame();
  }
  // One frame with the mouse at `at`, its left button down or up.
  void mouse_frame(ImVec2 at, bool down) {
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = at;
    io.MouseDown[0] = down;
    frame();
  }
  // Clicks the item `label` of the window `window_name` as a user would: moves the mouse along the window's middle
  // row (horizontal) or column until ImGui says that item is hovered, then presses and releases the button there.
  // `id_seed` is the ID stack the item was made under (the window's ID; a menu bar pushes "##menubar" onto it).
  // False when no position hovers it.
  bool click_item(const char* window_name, const char* label, bool horizontal, bool in_menu_bar) {
    ImGuiWindow* window = ImGui::FindWindowByName(window_name);
    if (window == nullptr) return false;
    const ImGuiID seed = in_menu_bar ? ImHashStr("##menubar", 0, window->ID) : window->ID;
    const ImGuiID id = ImHashStr(label, 0, seed);
    const ImVec2 from = window->Pos, size = window->Size;
    for (float t = 2.0f; t < (horizontal ? size.x : size.y); t += 4.0f) {
      const ImVec2 at = horizontal ? ImVec2(from.x + t, from.y + size.y / 2.0f) : ImVec2(from.x + size.x / 2.0f, from.y + t);
      mouse_frame(at, false);
      if (ImGui::GetCurrentContext()->HoveredIdPreviousFrame == id) {
        mouse_frame(at, true);
        mouse_frame(at, false);
        return true;
      }
    }
    return false;
  }
  // Waits for every export the app started and returns their messages.
  std::vector<std::string> finished_exports() {
    std::vector<std::string> messages;
    for (auto& pending : state_.exports) messages.push_back(pending.get());
    state_.exports.clear();
    return messages;
  }

  gui_test::ScratchDirectory dir_;
  ImGuiContext* context_ = nullptr;
  AppState state_;
};

TEST_F(AppFrameTest, SelectsRunsAndColoursThemInSelectionOrder) {
  frame();
  ASSERT_EQ(state_.library_state.runs.size(), 3u);
  ASSERT_EQ(selected_runs(state_).size(), 3u);
  EXPECT_EQ(selected_runs(state_)[0]->name, "run0");
  EXPECT_EQ(state_.selection_position.at((dir_ / "run2.h5").string()), 2u);
  // Deselecting the first run moves the others up (and their colours with them).
  state_.selection.erase(state_.selection.begin());
  state_.selection_touched = true;
  frame();
  ASSERT_EQ(selected_runs(state_).size(), 2u);
  EXPECT_EQ(selected_runs(state_)[0]->name, "run1");
  EXPECT_EQ(state_.selection_position.at((dir_ / "run1.h5").string()), 0u);
}

TEST_F(AppFrameTest, ArrowKeysStepRecordsAndSpacePlays) {
  frame();
  EXPECT_EQ(state_.record, -1);  // the last record
  press(glfw_key_left);
  EXPECT_EQ(state_.record, 5);  // the longest selected run has 7 records: 6 is the last, one back is 5
  press(glfw_key_left);
  EXPECT_EQ(state_.record, 4);
  press(glfw_key_right);
  press(glfw_key_right);
  press(glfw_key_right);
  EXPECT_EQ(state_.record, 6) << "stops at the last record";

  press(glfw_key_space);
  EXPECT_TRUE(state_.playing);
  EXPECT_EQ(state_.record, 0) << "playing from the end starts again at the first record";
  // 4 records a second: a quarter second is one record.
  frame(-1, false, 0.25f);
  frame(-1, false, 0.25f);
  EXPECT_EQ(state_.record, 2);
  for (int i = 0; i < 5; ++i) frame(-1, false, 0.25f);
  EXPECT_EQ(state_.record, 0) << "wraps around after the last record";
  press(glfw_key_space);
  EXPECT_FALSE(state_.playing);
}

TEST_F(AppFrameTest, F1ShowsHelpAndCtrlOOpensAFolder) {
  frame();
  press(glfw_key_f1);
  EXPECT_TRUE(state_.show_help);
  press(glfw_key_f1);
  EXPECT_FALSE(state_.show_help);
  press(glfw_key_o);
  EXPECT_FALSE(state_.open_folder_requested) << "O without Ctrl is not a shortcut";
  EXPECT_FALSE(ImGui::IsPopupOpen("", ImGuiPopupFlags_AnyPopupId | ImGuiPopupFlags_AnyPopupLevel));
  frame(glfw_key_o, true);
  EXPECT_TRUE(ImGui::IsPopupOpen("", ImGuiPopupFlags_AnyPopupId | ImGuiPopupFlags_AnyPopupLevel));
  // While its path field has the keyboard, shortcuts are text: F1 does nothing.
  frame();
  press(glfw_key_f1);
  EXPECT_FALSE(state_.show_help);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(AppFrameTest, CtrlEAndTheExportMenuWriteTheFocusedView) {
  state_.export_directory = dir_.path();
  frame();
  frame();
  press(glfw_key_e);
  EXPECT_TRUE(state_.exports.empty()) << "E without Ctrl is not a shortcut";
  press(glfw_key_e, true);
  const auto saved = finished_exports();
  const std::string svg_path = (dir_ / "depth_1.svg").string();
  EXPECT_EQ(saved, std::vector<std::string>{"saved " + svg_path});
  const std::string svg = read_text(svg_path);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << svg.substr(0, 80);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("data-run=\"run2\""), std::string::npos) << "every selected run is in the figure";

  // The Export menu, clicked: its CSV item writes the view's data.
  state_.view = View::grid;
  frame();
  ASSERT_TRUE(click_item("##MainMenuBar", "Export", true, true)) << "no Export menu in the main menu bar";
  EXPECT_TRUE(ImGui::IsPopupOpen("", ImGuiPopupFlags_AnyPopupId | ImGuiPopupFlags_AnyPopupLevel));
  ASSERT_TRUE(click_item("##Menu_00", "View's data as CSV", false, false)) << "no CSV item in the Export menu";
  const auto written = finished_exports();
  const std::string csv_path = (dir_ / "grid_2.csv").string();
  EXPECT_EQ(written, std::vector<std::string>{"saved " + csv_path});
  const std::string csv = read_text(csv_path);
  EXPECT_EQ(csv.rfind("panel,series,run,probe,x,y\n", 0), 0u) << csv.substr(0, 80);
  EXPECT_NE(csv.find("grid/backward/"), std::string::npos);
  EXPECT_FALSE(ImGui::IsPopupOpen("", ImGuiPopupFlags_AnyPopupId | ImGuiPopupFlags_AnyPopupLevel))
      << "the menu closes";
}

}  // namespace
}  // namespace proplab::gui

#endif
